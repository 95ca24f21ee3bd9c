-- Count one redelivery of a message; one call per redelivered execution start.
--
-- KEYS[1] = delivery counter of the task id
-- ARGV[1] = counter lifetime in milliseconds (longer than any redelivery loop)
-- Returns the number of redeliveries so far, this one included.
local deliveries = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
return deliveries
