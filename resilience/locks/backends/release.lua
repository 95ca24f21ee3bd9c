-- Delete the lock only when the caller still owns it (never another holder's lock).
-- KEYS[1] = lock key
-- ARGV[1] = owner token
-- returns 1 when deleted, 0 when not owned (expired or taken over)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
