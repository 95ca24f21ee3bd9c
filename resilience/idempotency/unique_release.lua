-- Unique enqueue: give the key back, only if it still names this job.
-- KEYS[1] = unique key
-- ARGV[1] = task id expected to hold it
-- Returns: 1 when deleted, 0 when the key is gone or names another job.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
