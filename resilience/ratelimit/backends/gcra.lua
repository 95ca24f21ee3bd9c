-- GCRA decision on Redis server time. Limiter state is O(1) per key: the theoretical
-- arrival time (TAT). Denied callers also wait in a line (see below).
-- KEYS[1] = limiter key (string: TAT in integer microseconds)
-- KEYS[2] = waiting line (sorted set: member = caller id, score = first denial, microseconds)
-- ARGV[1] = emission interval, microseconds
-- ARGV[2] = burst (permits that may be taken at once, >= 1)
-- ARGV[3] = cost (permits this request takes)
-- ARGV[4] = caller id (a task id: stable across its deferrals)
-- returns {allowed 0|1, retry_after_us, now_us}
-- Waiting line: a denied caller is told to come back after the time the next permit frees
-- plus one interval per caller ahead of it in the line (first denied, first served), so N
-- deferred jobs return spread at the limit's rate instead of all at once; a caller denied
-- again keeps its place. A granted caller leaves the line.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local new_tat = tat + interval * cost
local excess = new_tat - now - interval * burst
if excess > 0 then
  local arrived = redis.call('ZSCORE', KEYS[2], ARGV[4])
  if not arrived then
    arrived = now
    redis.call('ZADD', KEYS[2], string.format('%d', now), ARGV[4])
  end
  local ahead = redis.call('ZCOUNT', KEYS[2], '-inf', '(' .. string.format('%d', tonumber(arrived)))
  local retry = excess + ahead * interval * cost
  local keep_ms = math.floor(retry / 1000) + 60000
  if redis.call('PTTL', KEYS[2]) < keep_ms then redis.call('PEXPIRE', KEYS[2], keep_ms) end
  return {0, string.format('%d', retry), string.format('%d', now)}
end
redis.call('ZREM', KEYS[2], ARGV[4])
-- The TAT is worthless once it has passed: expire it then.
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', math.floor((new_tat - now) / 1000) + 1)
return {1, '0', string.format('%d', now)}
