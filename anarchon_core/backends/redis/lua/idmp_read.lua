-- anarchon idmp: after XADD ... IDMP answered an entry id, read that entry's token (the
-- first claim's) and trim the stream to about history_size entries.
-- KEYS: runs (stream); ARGV: entry id, history_size
-- Returns {token of the entry or "" if it is gone (trimmed: never ours), now_ms}.
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now_s = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local e = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
redis.call('XTRIM', KEYS[1], 'MAXLEN', '~', ARGV[2])
if e[1] then
  local f = e[1][2]
  for i = 1, #f - 1, 2 do
    if f[i] == 'token' then return {f[i + 1], now_s} end
  end
end
return {'', now_s}
