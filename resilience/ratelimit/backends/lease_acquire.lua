-- Distributed semaphore whose slots are leases, on Redis server time.
-- KEYS[1] = semaphore key (sorted set: member = holder id, score = lease expiry in microseconds)
-- ARGV[1] = limit (slots)
-- ARGV[2] = lease, microseconds
-- ARGV[3] = holder id (unique per execution)
-- returns {allowed 0|1, retry_after_us (until the earliest lease ends), now_us, holders}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
-- Reclaim the slots of holders that died (SIGKILL, lost machine) without releasing.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
local held = redis.call('ZSCORE', KEYS[1], ARGV[3])
local count = redis.call('ZCARD', KEYS[1])
if held or count < limit then
  redis.call('ZADD', KEYS[1], string.format('%d', now + lease), ARGV[3])
  local ttl = redis.call('PTTL', KEYS[1])
  local lease_ms = math.floor(lease / 1000) + 1000
  if ttl < lease_ms then redis.call('PEXPIRE', KEYS[1], lease_ms) end
  if not held then count = count + 1 end
  return {1, '0', string.format('%d', now), count}
end
local earliest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {0, string.format('%d', tonumber(earliest[2]) - now), string.format('%d', now), count}
