-- anarchon stream-id claim: XADD with the slot as the explicit entry id. Redis rejects an
-- id not greater than the stream's top, so only the first claim of a slot succeeds (and a
-- late claim for an earlier slot fails once a later one was written).
-- KEYS: runs (stream); ARGV: slot, token, runner, maxlen, max_late_ms (-1: none)
-- Returns {1 won | 0 taken | 2 first claim but late (recorded, never run), now_ms}.
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_s = string.format('%.0f', now)
local id = ARGV[1] .. '-0'
local r = redis.pcall('XADD', KEYS[1], 'MAXLEN', '~', ARGV[4], id,
                      'slot', ARGV[1], 'token', ARGV[2], 'runner', ARGV[3], 'at', now_s)
if type(r) == 'table' and r.err then
  if not string.find(r.err, 'equal or smaller', 1, true) then return r end
  -- A retry of our own claim whose answer was lost still wins.
  local e = redis.call('XRANGE', KEYS[1], id, id)
  if e[1] and e[1][2][4] == ARGV[2] then return {1, now_s} end
  return {0, now_s}
end
local max_late = tonumber(ARGV[5])
if max_late >= 0 and now > tonumber(ARGV[1]) + max_late then return {2, now_s} end
return {1, now_s}
