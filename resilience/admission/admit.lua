-- Tier admission: depth (all priority lists of the queue) + in-flight reservations < limit.
-- KEYS[1] = reservations of the queue (sorted set: member = reservation id,
--           score = expiry in microseconds, Redis server time)
-- KEYS[2..n] = the queue's lists, one per kombu priority step (queue, queue\x06\x163, ...)
-- ARGV[1] = limit (most messages waiting)
-- ARGV[2] = reservation id (unique per publish)
-- ARGV[3] = reservation ttl, microseconds (a producer that dies mid-publish frees it then)
-- returns {admitted 0|1, depth, reserved}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit = tonumber(ARGV[1])
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
local depth = 0
for i = 2, #KEYS do
  depth = depth + redis.call('LLEN', KEYS[i])
end
local reserved = redis.call('ZCARD', KEYS[1])
if depth + reserved < limit then
  redis.call('ZADD', KEYS[1], string.format('%d', now + ttl), ARGV[2])
  redis.call('PEXPIRE', KEYS[1], math.floor(ttl / 1000) + 1000)
  return {1, depth, reserved + 1}
end
return {0, depth, reserved}
