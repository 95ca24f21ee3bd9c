-- Record the outcome of a permitted call and apply the transition it causes; one call.
--
-- KEYS[1] = breaker state hash   KEYS[2] = breaker window (list or slot hash)
-- ARGV[1] = generation the permission was given under (from acquire.lua)
-- ARGV[2] = outcome: 'success' | 'failure' | 'ignored' (ignored gives a probe permit back)
-- ARGV[3] = slow: 1 if the call took at least the slow-call duration, else 0
-- ARGV[4] = window kind: 'count' | 'time'
-- ARGV[5] = window size: calls (count) or milliseconds (time)
-- ARGV[6] = slots of a time window
-- ARGV[7] = minimum calls in the window before the breaker may open
-- ARGV[8] = failure-rate threshold (0..1)
-- ARGV[9] = slow-call-rate threshold (0..1; above 1 = disabled)
-- ARGV[10] = open duration in ms
-- ARGV[11] = half-open probes that must succeed to close
-- ARGV[12] = how many such outcomes (optional, default 1): a process's aggregated successes
--            (`resilience.circuit.local`) arrive as one call; a count window gets that many
--            entries, a time window's slot that many calls. More than one is only ever sent
--            for a closed breaker; in any other state such a report changes nothing.
-- Returns {transition ('' | 'open' | 'closed'), state, calls, failures, slow calls}
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local given_gen = tonumber(ARGV[1])
local outcome = ARGV[2]
local slow = tonumber(ARGV[3])
local kind = ARGV[4]
local size = tonumber(ARGV[5])
local slots = tonumber(ARGV[6])
local minimum_calls = tonumber(ARGV[7])
local failure_threshold = tonumber(ARGV[8])
local slow_threshold = tonumber(ARGV[9])
local open_ms = tonumber(ARGV[10])
local probes_to_close = tonumber(ARGV[11])
local n = tonumber(ARGV[12] or '1')

local values = redis.call('HMGET', KEYS[1], 'state', 'gen')
local state = values[1] or 'closed'
local gen = tonumber(values[2] or '0')
if given_gen ~= gen or state == 'open' or state == 'forced_open' or state == 'forced_closed' then
  -- Admitted under an older state (or the breaker is held by an operator): no verdict.
  return {'', state, 0, 0, 0}
end
if n ~= 1 and state ~= 'closed' then
  return {'', state, 0, 0, 0}
end

local function clear_window()
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[1], 'calls', 0, 'failures', 0, 'slow', 0)
end

local function open()
  redis.call('HSET', KEYS[1], 'state', 'open', 'gen', gen + 1, 'open_until', now_ms + open_ms,
    'changed_at', now_ms)
  redis.call('HINCRBY', KEYS[1], 'n_opened', 1)
  clear_window()
end

local failed = 0
if outcome == 'failure' then failed = 1 end

if state == 'half_open' then
  if outcome == 'ignored' then
    if tonumber(redis.call('HGET', KEYS[1], 'probes') or '0') > 0 then
      redis.call('HINCRBY', KEYS[1], 'probes', -1)
    end
    return {'', state, 0, 0, 0}
  end
  if failed == 1 or slow == 1 then
    open()
    return {'open', 'open', 0, 0, 0}
  end
  local ok = redis.call('HINCRBY', KEYS[1], 'probes_ok', 1)
  if ok >= probes_to_close then
    redis.call('HSET', KEYS[1], 'state', 'closed', 'gen', gen + 1, 'changed_at', now_ms)
    redis.call('HINCRBY', KEYS[1], 'n_closed', 1)
    clear_window()
    return {'closed', 'closed', 0, 0, 0}
  end
  return {'', state, 0, 0, 0}
end

-- closed
if outcome == 'ignored' then
  return {'', state, 0, 0, 0}
end
local calls, failures, slows
if kind == 'count' then
  -- The newest min(n, size) outcomes enter the list (older ones would leave it at once).
  local value = failed + 2 * slow
  local pushed = math.min(n, size)
  local chunk = {}
  for i = 1, pushed do
    chunk[#chunk + 1] = value
    if #chunk == 1000 or i == pushed then
      redis.call('LPUSH', KEYS[2], unpack(chunk))
      chunk = {}
    end
  end
  calls = redis.call('HINCRBY', KEYS[1], 'calls', pushed)
  failures = redis.call('HINCRBY', KEYS[1], 'failures', failed * pushed)
  slows = redis.call('HINCRBY', KEYS[1], 'slow', slow * pushed)
  if calls > size and pushed == 1 then
    local old = tonumber(redis.call('RPOP', KEYS[2]))
    calls = redis.call('HINCRBY', KEYS[1], 'calls', -1)
    local old_failed, old_slow = 0, 0
    if old % 2 == 1 then old_failed = -1 end
    if old >= 2 then old_slow = -1 end
    failures = redis.call('HINCRBY', KEYS[1], 'failures', old_failed)
    slows = redis.call('HINCRBY', KEYS[1], 'slow', old_slow)
  elseif calls > size then
    local old = redis.call('LRANGE', KEYS[2], size, -1)
    redis.call('LTRIM', KEYS[2], 0, size - 1)
    local old_failed, old_slow = 0, 0
    for i = 1, #old do
      local entry = tonumber(old[i])
      if entry % 2 == 1 then old_failed = old_failed + 1 end
      if entry >= 2 then old_slow = old_slow + 1 end
    end
    -- 0 - x, not -x: Lua's -0 reaches Redis as "-0", which HINCRBY refuses.
    calls = redis.call('HINCRBY', KEYS[1], 'calls', 0 - #old)
    failures = redis.call('HINCRBY', KEYS[1], 'failures', 0 - old_failed)
    slows = redis.call('HINCRBY', KEYS[1], 'slow', 0 - old_slow)
  end
else
  local slot_ms = math.max(1, math.floor(size / slots))
  local epoch = math.floor(now_ms / slot_ms)
  local slot = epoch % slots
  if tonumber(redis.call('HGET', KEYS[2], 'e' .. slot) or '-1') ~= epoch then
    redis.call('HSET', KEYS[2], 'e' .. slot, epoch, 'c' .. slot, 0, 'f' .. slot, 0, 's' .. slot, 0)
  end
  redis.call('HINCRBY', KEYS[2], 'c' .. slot, n)
  redis.call('HINCRBY', KEYS[2], 'f' .. slot, failed * n)
  redis.call('HINCRBY', KEYS[2], 's' .. slot, slow * n)
  redis.call('PEXPIRE', KEYS[2], size * 2)
  calls, failures, slows = 0, 0, 0
  local all = redis.call('HGETALL', KEYS[2])
  local fields = {}
  for i = 1, #all, 2 do fields[all[i]] = all[i + 1] end
  for i = 0, slots - 1 do
    if tonumber(fields['e' .. i] or '-1') > epoch - slots then
      calls = calls + tonumber(fields['c' .. i] or '0')
      failures = failures + tonumber(fields['f' .. i] or '0')
      slows = slows + tonumber(fields['s' .. i] or '0')
    end
  end
end

if calls >= minimum_calls and
    (failures >= failure_threshold * calls or slows >= slow_threshold * calls) then
  open()
  return {'open', 'open', calls, failures, slows}
end
return {'', state, calls, failures, slows}
