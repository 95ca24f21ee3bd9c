-- Count one delivery of a message; one call per execution start.
--
-- KEYS[1] = delivery counter of the task id
-- ARGV[1] = counter lifetime in milliseconds (longer than any redelivery loop)
-- Returns the number of deliveries so far, this one included.
local deliveries = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
return deliveries
