-- anarchon claim-only finish: record the one result of a run unless it has one already.
-- KEYS: results (sorted set); ARGV: score (slot*2+manual), member, history_size
-- Returns 1 if recorded, 0 if the run already had a result.
if #redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[1], 'LIMIT', 0, 1) > 0 then return 0 end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
local excess = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[3])
if excess > 0 then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, excess - 1) end
return 1
