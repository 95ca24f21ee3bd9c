-- Store a task's result unless the state stored already is one this write must not replace.
-- KEYS[1] = the result key (celery-task-meta-<task id>)
-- ARGV[1] = the encoded result (JSON: Celery's meta, `status` at its top level)
-- ARGV[2] = seconds the key lives; 0 = no expiry
-- ARGV[3..n] = the states kept against this write (a late RETRY or STARTED keeps SUCCESS,
--              FAILURE and REVOKED; a final write keeps SUCCESS only, as Celery does)
-- Returns 1 when stored and published on the key's channel, 0 when the stored state stays.
local current = redis.call('GET', KEYS[1])
if current then
  local ok, meta = pcall(cjson.decode, current)
  if ok and type(meta) == 'table' then
    local status = meta['status']
    for i = 3, #ARGV do
      if status == ARGV[i] then
        return 0
      end
    end
  end
end
local seconds = tonumber(ARGV[2])
if seconds > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', seconds)
else
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', KEYS[1], ARGV[1])
return 1
