-- anarchon: the results of a claim-only job for the given runs.
-- KEYS: results (sorted set); ARGV: score (slot*2+manual), ...
local out = {}
for i = 1, #ARGV do
  out[i] = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[i], ARGV[i], 'LIMIT', 0, 1)[1] or ''
end
return out
