-- Strict sliding-window (log) decision on Redis server time.
-- KEYS[1] = limiter key (sorted set: member = grant token, score = grant time in microseconds)
-- KEYS[2] = waiting line (sorted set: member = caller id, score = first denial, microseconds)
-- ARGV[1] = limit (grants per window)
-- ARGV[2] = window, microseconds
-- ARGV[3] = grant token (unique per request)
-- ARGV[4] = caller id (a task id: stable across its deferrals)
-- returns {allowed 0|1, retry_after_us, now_us, grants_in_window}
-- Denied callers wait in line, window/limit apart per caller ahead (see gcra.lua).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
-- A grant at or before now - window has left the window (half-open window (now-window, now]).
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now - window))
local used = redis.call('ZCARD', KEYS[1])
if used < limit then
  redis.call('ZADD', KEYS[1], string.format('%d', now), ARGV[3])
  redis.call('PEXPIRE', KEYS[1], math.floor(window / 1000) + 1)
  redis.call('ZREM', KEYS[2], ARGV[4])
  return {1, '0', string.format('%d', now), used + 1}
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local excess = tonumber(oldest[2]) + window - now
local arrived = redis.call('ZSCORE', KEYS[2], ARGV[4])
if not arrived then
  arrived = now
  redis.call('ZADD', KEYS[2], string.format('%d', now), ARGV[4])
end
local ahead = redis.call('ZCOUNT', KEYS[2], '-inf', '(' .. string.format('%d', tonumber(arrived)))
local retry = excess + ahead * math.floor(window / limit)
local keep_ms = math.floor(retry / 1000) + 60000
if redis.call('PTTL', KEYS[2]) < keep_ms then redis.call('PEXPIRE', KEYS[2], keep_ms) end
return {0, string.format('%d', retry), string.format('%d', now), used}
