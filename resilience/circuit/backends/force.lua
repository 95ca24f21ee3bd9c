-- Put a breaker in a state by hand (operator): forced_open, forced_closed, or closed (reset).
--
-- KEYS[1] = breaker state hash   KEYS[2] = breaker window
-- ARGV[1] = target state: 'forced_open' | 'forced_closed' | 'closed'
-- Returns the previous state. The generation moves on, so calls admitted before are ignored.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local previous = redis.call('HGET', KEYS[1], 'state') or 'closed'
redis.call('HINCRBY', KEYS[1], 'gen', 1)
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'changed_at', now_ms, 'calls', 0, 'failures', 0,
  'slow', 0, 'probes', 0, 'probes_ok', 0)
redis.call('DEL', KEYS[2])
return previous
