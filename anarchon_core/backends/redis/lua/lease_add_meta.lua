-- anarchon lease add_meta: read, or replace, the meta of one ended attempt of a run: its
-- results entry and, while it is the run's current attempt, its state record.
-- KEYS: state (hash), results (sorted set)
-- ARGV: op (read | write), run_id, attempt, score (of the run's results);
--       write: the meta as read ("" for none), the new meta (JSON text)
-- read answers the attempt's stored meta ("" for none), or false when no ended attempt
-- matches; write answers 1 once replaced, 0 when no ended attempt matches, and -1 when the
-- meta changed since it was read (the caller reads again and merges anew).
-- Records that are not JSON objects anarchon wrote are left alone.
if redis.replicate_commands then redis.replicate_commands() end
local op, run_id, attempt, score = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local function ended(text)
  local ok, rec = pcall(cjson.decode, text)
  if ok and type(rec) == 'table' and tostring(rec.a) == attempt and type(rec.s) == 'string'
      and rec.s ~= 'running' then
    return rec
  end
  return nil
end
local function meta_of(rec)
  if type(rec.m) == 'string' then return rec.m end
  return ''
end

local entries = {}
for _, text in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], score, score)) do
  local rec = ended(text)
  if rec then entries[#entries + 1] = {text, rec} end
end
local raw = redis.call('HGET', KEYS[1], run_id)
local st = raw and ended(raw)
if not st and not entries[1] then
  if op == 'read' then return false end
  return 0
end
-- the results entry is what history shows of an ended attempt; the state, when none
local current = entries[1] and meta_of(entries[1][2]) or meta_of(st)
if op == 'read' then return current end
if op ~= 'write' then
  return redis.error_reply('anarchon: unknown add_meta operation ' .. tostring(op))
end
if current ~= ARGV[5] then return -1 end
local meta = ARGV[6]
for _, entry in ipairs(entries) do
  entry[2].m = meta
  redis.call('ZREM', KEYS[2], entry[1])
  redis.call('ZADD', KEYS[2], score, cjson.encode(entry[2]))
end
if st then
  st.m = meta
  redis.call('HSET', KEYS[1], run_id, cjson.encode(st))
end
return 1
