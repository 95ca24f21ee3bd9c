-- Guarded publish: the enqueue guards' checks and the LPUSH in one step (one round trip).
-- Unique first (a duplicate names the queued job even when the queue is full, as the
-- UNIQUE stage runs before ADMIT), then the depth bound, then the key and the push.
-- The depth is every priority list of the queue plus the live reservations of producers
-- that admit through admit.lua first (the `wait` policy), so both share one exact bound.
-- KEYS[1] = the list to push to (the message's priority list)
-- KEYS[2] = reservations of the queue (sorted set, score = expiry in µs, Redis time)
-- KEYS[3] = the unique key (unused when ARGV[3] is '')
-- KEYS[4..n] = every list of the queue, one per kombu priority step
-- ARGV[1] = limit, most messages waiting (0: no bound)
-- ARGV[2] = the message, as kombu would LPUSH it
-- ARGV[3] = task id to hold the unique key for ('' : no unique key)
-- ARGV[4] = the unique key's time to live, milliseconds
-- returns {status, depth, reserved, holder}: status 1 pushed, 0 full (nothing done),
-- 2 duplicate (holder = the task id holding the unique key; nothing done)
if ARGV[3] ~= '' then
  local holder = redis.call('GET', KEYS[3])
  if holder then
    return {2, 0, 0, holder}
  end
end
local depth, reserved = 0, 0
local limit = tonumber(ARGV[1])
if limit > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('%d', now))
  for i = 4, #KEYS do
    depth = depth + redis.call('LLEN', KEYS[i])
  end
  reserved = redis.call('ZCARD', KEYS[2])
  if depth + reserved >= limit then
    return {0, depth, reserved, false}
  end
end
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
end
redis.call('LPUSH', KEYS[1], ARGV[2])
return {1, depth, reserved, false}
