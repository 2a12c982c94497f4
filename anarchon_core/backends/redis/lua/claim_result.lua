-- anarchon claim-only finish: record the one result of a run unless it has one already.
-- KEYS: results (sorted set); ARGV: score (slot*2+manual), token, status, error,
--       history_size, meta (JSON text, "" for none)
-- Returns 1 if recorded, 0 if the run already had a result.
if redis.replicate_commands then redis.replicate_commands() end
if #redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[1], 'LIMIT', 0, 1) > 0 then return 0 end
local t = redis.call('TIME')
local now = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local err = ARGV[4]
if err == '' then err = nil end
local meta = ARGV[6]
if meta == nil or meta == '' then meta = nil end
redis.call('ZADD', KEYS[1], ARGV[1],
           cjson.encode({t = ARGV[2], s = ARGV[3], e = err, f = now, m = meta}))
local excess = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[5])
if excess > 0 then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, excess - 1) end
return 1
