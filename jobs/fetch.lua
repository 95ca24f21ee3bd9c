-- Reliable fetch: take the oldest message of the first non-empty list and record it as
-- unacknowledged in the same step, so no instant exists where it is in neither place.
-- The record is exactly the one kombu's Redis QoS writes on delivery (unacked hash entry
-- `[payload, exchange, routing_key]`, index scored by the time), so kombu's own visibility
-- restore brings it back if the worker dies before acknowledging.
--
-- KEYS[1] = the unacked hash, KEYS[2] = the unacked index (sorted set),
-- KEYS[3] = the list where unreadable items are set aside,
-- KEYS[4..] = the queue lists to take from, in priority order.
-- ARGV[1] = now, in seconds (the client's clock, as kombu's QoS uses).
-- ARGV[2] = a fresh delivery tag, for a redelivered message.
--
-- A redelivered message (kombu's restore marks it `redelivered`) is recorded under the
-- fresh tag, written into the message too: kombu restores a message with the tag of the
-- delivery that expired, and a late ack of that delivery (HDEL/ZREM by tag) would otherwise
-- remove the hold of the worker that took the message over. The tag is replaced in the
-- text, not re-encoded (see below); a message whose tag is not found keeps it.
-- Returns {list key, message, delivery tag}; {list key, '', 'unreadable'} when the item
-- taken was not kombu JSON (moved to KEYS[3], nothing else is taken in this call); false
-- when every list is empty.
for i = 4, #KEYS do
  local item = redis.call('RPOP', KEYS[i])
  if item then
    local ok, message = pcall(cjson.decode, item)
    if ok and type(message) == 'table' and type(message.properties) == 'table' then
      local properties = message.properties
      local tag = properties.delivery_tag
      local info = properties.delivery_info
      if type(tag) == 'string' and type(info) == 'table' then
        if info.redelivered == true then
          for _, separator in ipairs({'": "', '":"'}) do
            local field = '"delivery_tag' .. separator .. tag .. '"'
            local first, last = string.find(item, field, 1, true)
            if first then
              item = string.sub(item, 1, first - 1) .. '"delivery_tag' .. separator
                .. ARGV[2] .. '"' .. string.sub(item, last + 1)
              tag = ARGV[2]
              break
            end
          end
        end
        redis.call('ZADD', KEYS[2], ARGV[1], tag)
        -- Spliced, not re-encoded: cjson would turn an empty list into an object.
        redis.call('HSET', KEYS[1], tag, '[' .. item .. ',' .. cjson.encode(info.exchange or '')
          .. ',' .. cjson.encode(info.routing_key or '') .. ']')
        return {KEYS[i], item, tag}
      end
    end
    redis.call('LPUSH', KEYS[3], item)
    return {KEYS[i], '', 'unreadable'}
  end
end
return false
