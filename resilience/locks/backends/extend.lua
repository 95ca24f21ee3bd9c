-- Reset the lock's TTL only when the caller still owns it (a lease renewal).
-- KEYS[1] = lock key
-- ARGV[1] = owner token
-- ARGV[2] = new ttl in milliseconds (> 0), counted from now
-- returns 1 when extended, 0 when not owned
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
