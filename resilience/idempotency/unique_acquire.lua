-- Unique enqueue: take the key for a new job, or name the job that holds it.
-- KEYS[1] = unique key ("resilience:unique:<task>:<key>")
-- ARGV[1] = task id of the job being enqueued
-- ARGV[2] = time to live in milliseconds
-- Returns: false (nil) when the key was taken for ARGV[1]; otherwise the holder's task id.
local holder = redis.call('GET', KEYS[1])
if holder then
  return holder
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
