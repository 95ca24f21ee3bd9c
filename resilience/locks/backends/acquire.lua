-- Take the lock when nobody holds it; the owner token makes release and extend safe.
-- KEYS[1] = lock key
-- ARGV[1] = owner token (random, unique per acquisition)
-- ARGV[2] = ttl in milliseconds (> 0)
-- returns 1 when taken, 0 when another owner holds it
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
