-- Fleet-wide retry budget of one dependency: one call of this script is one decision.
--
-- KEYS[1] = budget hash of the dependency (ring of time slots)
-- ARGV[1] = mode: "request" (count a call), "retry" (ask to spend one retry),
--           "forced" (count a retry that already happened, e.g. the task's own self.retry);
--           "request+retry" / "request+forced" count the failed call first, then do the rest
-- ARGV[2] = window in milliseconds
-- ARGV[3] = ratio: retries allowed per request in the window (0..1)
-- ARGV[4] = floor: retries always allowed per window (min_per_second * window_seconds)
-- ARGV[5] = number of slots the window is cut into
-- ARGV[6] = requests a "request..." mode counts (optional, default 1): a process's
--           aggregated requests (`budget.py`, `RequestCounts`) arrive as one call
-- Returns {allowed (1/0), requests in window, retries in window}
--
-- The window is a ring of slots, slot i holding fields e<i> (the slot's epoch: which
-- window-slice it counts), q<i> (requests), r<i> (retries). A slot whose epoch is stale is
-- reset on write and skipped on read, so memory is bounded and no cleanup job is needed.
-- Status views read the same ring with budget.py's `window_figures` (keep the two in step).
-- A retry is granted while retries + 1 <= ratio * requests + floor (Finagle/Envoy budget).
local key = KEYS[1]
local mode = ARGV[1]
local window_ms = tonumber(ARGV[2])
local ratio = tonumber(ARGV[3])
local floor = tonumber(ARGV[4])
local slots = tonumber(ARGV[5])
local amount = tonumber(ARGV[6] or '1')

local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local slot_ms = math.max(1, math.floor(window_ms / slots))
local epoch = math.floor(now_ms / slot_ms)

local requests, retries = 0, 0
local values = redis.call('HGETALL', key)
local fields = {}
for i = 1, #values, 2 do fields[values[i]] = values[i + 1] end
for i = 0, slots - 1 do
  local slot_epoch = tonumber(fields['e' .. i] or '-1')
  if slot_epoch > epoch - slots then
    requests = requests + tonumber(fields['q' .. i] or '0')
    retries = retries + tonumber(fields['r' .. i] or '0')
  end
end

local slot = epoch % slots
local function bump(field, by)
  if tonumber(fields['e' .. slot] or '-1') ~= epoch then
    redis.call('HSET', key, 'e' .. slot, epoch, 'q' .. slot, 0, 'r' .. slot, 0)
  end
  redis.call('HINCRBY', key, field .. slot, by)
  redis.call('PEXPIRE', key, window_ms * 2)
end

if string.sub(mode, 1, 8) == 'request+' then
  if amount > 0 then
    bump('q', amount)
    requests = requests + amount
    fields['e' .. slot] = tostring(epoch)
  end
  mode = string.sub(mode, 9)
end
if mode == 'request' then
  bump('q', amount)
  return {1, requests + amount, retries}
end
if mode == 'forced' then
  bump('r', 1)
  return {1, requests, retries + 1}
end
if retries + 1 <= ratio * requests + floor then
  bump('r', 1)
  return {1, requests, retries + 1}
end
return {0, requests, retries}
