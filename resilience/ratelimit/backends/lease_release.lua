-- Give a holder's slot of a lease semaphore back (see lease_acquire.lua).
-- KEYS[1] = semaphore key (sorted set: member = holder id, score = lease expiry in microseconds)
-- ARGV[1] = holder id
-- returns 1 when the holder was still in the set, 0 when its lease had been reclaimed
return redis.call('ZREM', KEYS[1], ARGV[1])
