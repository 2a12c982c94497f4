-- anarchon claim-only manual run (run_now): one entry per manual run; a second claim of
-- the same manual slot (two instances in one millisecond) loses.
-- KEYS: manual (stream); ARGV: slot, token, runner, history_size
-- Returns 1 if this token holds the manual slot's entry, else 0.
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
for _, entry in ipairs(redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 100)) do
  local f = entry[2]
  if f[2] == ARGV[1] then
    if f[4] == ARGV[2] then return 1 end
    return 0
  end
end
redis.call('XADD', KEYS[1], 'MAXLEN', '~', math.max(tonumber(ARGV[4]), 100), '*',
           'slot', ARGV[1], 'token', ARGV[2], 'runner', ARGV[3], 'at', now)
return 1
