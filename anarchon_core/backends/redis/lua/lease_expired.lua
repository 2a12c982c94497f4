-- anarchon: runs of a job still running whose lease has expired (orphan candidates).
-- KEYS: state (hash), active (set)
-- ARGV: limit (runs to return), budget (members of the active set to look at, at most)
-- Returns {{run_id, attempt, lease_until, ...}, {member, ...}}: the expired runs, then the
-- members whose state is corrupt (reported by the caller, left alone). A member without any state, or
-- whose run has finished, is dropped from the active set (it is not active).
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, budget = tonumber(ARGV[1]), tonumber(ARGV[2])
local expired, corrupt = {}, {}
local finished = {success = true, failed = true, interrupted = true, skipped = true}
local cursor, seen = '0', 0
repeat
  local page = redis.call('SSCAN', KEYS[2], cursor, 'COUNT', 100)
  cursor = page[1]
  for _, id in ipairs(page[2]) do
    seen = seen + 1
    local raw = redis.call('HGET', KEYS[1], id)
    if not raw then
      redis.call('SREM', KEYS[2], id)
    else
      local ok, st = pcall(cjson.decode, raw)
      if not ok or type(st) ~= 'table' or not tonumber(st.a) then
        corrupt[#corrupt + 1] = id
      elseif st.s == 'running' then
        if not (st.l and tonumber(st.l) and tonumber(st.l) > now) then
          expired[#expired + 1] = id
          expired[#expired + 1] = tostring(st.a)
          expired[#expired + 1] = tostring(tonumber(st.l) or -1)
        end
      elseif finished[st.s] then
        redis.call('SREM', KEYS[2], id)
      else
        corrupt[#corrupt + 1] = id
      end
    end
    if #expired >= 3 * limit then break end
  end
until cursor == '0' or #expired >= 3 * limit or seen >= budget
return {expired, corrupt}
