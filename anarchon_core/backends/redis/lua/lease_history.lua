-- anarchon lease history: the newest runs of a job with every attempt's record.
-- KEYS: state (hash), slots (sorted set), results (sorted set)
-- ARGV: limit (runs)
-- Returns {now_ms, {run_id, slot, state or "", {result, ...}}, ...}, newest slot first.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {string.format('%.0f', now)}
local ids = redis.call('ZREVRANGE', KEYS[2], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
for i = 1, #ids, 2 do
  local id, slot = ids[i], ids[i + 1]
  local sc = string.format('%.0f', tonumber(slot) * 2 + (string.sub(id, 1, 1) == 'm' and 1 or 0))
  local raw = redis.call('HGET', KEYS[1], id) or ''
  out[#out + 1] = {id, slot, raw, redis.call('ZRANGEBYSCORE', KEYS[3], sc, sc)}
end
return out
