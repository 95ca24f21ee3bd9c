-- Ask a breaker for permission to call its dependency; one call per decision.
--
-- KEYS[1] = breaker state hash   KEYS[2] = breaker window (list or slot hash)
-- ARGV[1] = half-open probes allowed fleet-wide
-- ARGV[2] = probe timeout in ms (half-open longer than this without a verdict re-opens)
-- ARGV[3] = open duration in ms
-- Returns {allowed 1/0, state, generation, wait_ms, transition ('' or the new state)}
--
-- `generation` changes on every transition; the caller hands it back to record.lua, which
-- ignores outcomes of calls admitted under an older generation. A probe permit is
-- therefore "a permission of a half_open generation", handed out at most ARGV[1] times.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local probes_allowed = tonumber(ARGV[1])
local probe_timeout_ms = tonumber(ARGV[2])
local open_ms = tonumber(ARGV[3])

local values = redis.call('HMGET', KEYS[1], 'state', 'gen', 'open_until', 'half_open_until', 'probes')
local state = values[1] or 'closed'
local gen = tonumber(values[2] or '0')
local open_until = tonumber(values[3] or '0')
local half_open_until = tonumber(values[4] or '0')
local probes = tonumber(values[5] or '0')

if state == 'closed' or state == 'forced_closed' then
  return {1, state, gen, 0, ''}
end
if state == 'forced_open' then
  return {0, state, gen, open_ms, ''}
end

local transition = ''
if state == 'open' then
  if now_ms < open_until then
    return {0, state, gen, open_until - now_ms, ''}
  end
  gen = gen + 1
  state = 'half_open'
  probes = 0
  half_open_until = now_ms + probe_timeout_ms
  redis.call('HSET', KEYS[1], 'state', state, 'gen', gen, 'half_open_until', half_open_until,
    'probes', 0, 'probes_ok', 0, 'changed_at', now_ms)
  redis.call('HINCRBY', KEYS[1], 'n_half_opened', 1)
  transition = 'half_open'
elseif now_ms >= half_open_until then
  -- Probes were handed out but no verdict came back in time (their workers died): open again.
  gen = gen + 1
  redis.call('HSET', KEYS[1], 'state', 'open', 'gen', gen, 'open_until', now_ms + open_ms,
    'changed_at', now_ms)
  redis.call('HINCRBY', KEYS[1], 'n_opened', 1)
  return {0, 'open', gen, open_ms, 'open'}
end

if probes < probes_allowed then
  redis.call('HINCRBY', KEYS[1], 'probes', 1)
  redis.call('HINCRBY', KEYS[1], 'n_probes', 1)
  return {1, state, gen, 0, transition}
end
return {0, state, gen, math.min(half_open_until - now_ms, open_ms), transition}
