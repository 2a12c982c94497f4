-- anarchon script claim: look for the slot among the stream's entries of the last
-- window_ms and append the claim only if it is absent.
-- KEYS: runs (stream); ARGV: slot, token, runner, window_ms, history_size,
--       max_late_ms (-1: none)
-- Returns {1 won | 0 taken | 2 first claim but late (recorded, never run), now_ms}.
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_s = string.format('%.0f', now)
local from = string.format('%.0f', now - tonumber(ARGV[4]))
local recent = redis.call('XREVRANGE', KEYS[1], '+', from)
for _, entry in ipairs(recent) do
  local f = entry[2]
  if f[2] == ARGV[1] then
    if f[4] == ARGV[2] then return {1, now_s} end  -- a retry of our own claim
    return {0, now_s}
  end
end
-- Never trim an entry of the window: that would let a second claim of its slot in.
local keep = math.max(tonumber(ARGV[5]), #recent + 1)
redis.call('XADD', KEYS[1], 'MAXLEN', '~', keep, '*', 'slot', ARGV[1], 'token', ARGV[2],
           'runner', ARGV[3], 'at', now_s)
local max_late = tonumber(ARGV[6])
if max_late >= 0 and now > tonumber(ARGV[1]) + max_late then return {2, now_s} end
return {1, now_s}
