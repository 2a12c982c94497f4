-- anarchon lease heartbeat / finish / release: act only on the current attempt, while it
-- is running, with the caller's token; answer 1 if done, 0 if the caller is fenced.
-- KEYS: state (hash), active (set), results (sorted set)
-- ARGV: op (heartbeat | finish | release), run_id, attempt, token,
--       heartbeat: lease_ms; finish: score, status, error ("" for none), meta (JSON
--       text, "" for none);
--       release: the hand-over note (decision.HANDED_OVER), kept as the attempt's error
--       (decision.released_error: a waiting attempt's is WAITING_HANDED_OVER, a cancelled
--       one stays CANCELLED)
local HANDED_OVER = "@HANDED_OVER@"
local WAITING = "@WAITING@"
local WAITING_HANDED_OVER = "@WAITING_HANDED_OVER@"
local CANCELLED = "@CANCELLED@"
if redis.replicate_commands then redis.replicate_commands() end
local op, run_id, attempt, token = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local raw = redis.call('HGET', KEYS[1], run_id)
if not raw then return 0 end
local ok, st = pcall(cjson.decode, raw)
if not ok or type(st) ~= 'table' then return 0 end  -- not a state anarchon wrote: fenced
if st.s ~= 'running' or st.t ~= token or st.a ~= attempt then return 0 end
-- a release and a cancellation are final: no heartbeat or finish of a released or
-- cancelled attempt (decision.update_applies, FINAL_NOTES)
local e = st.e
if op ~= 'release' and (e == HANDED_OVER or e == WAITING_HANDED_OVER or e == CANCELLED) then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function num(x) return string.format('%.0f', x) end
if op == 'heartbeat' then
  st.l = num(now + tonumber(ARGV[5]))
elseif op == 'release' then
  if e == WAITING or e == WAITING_HANDED_OVER then
    e = WAITING_HANDED_OVER
  elseif e ~= CANCELLED then
    e = ARGV[5]
  end
  st.l, st.e = num(now), e
elseif op == 'finish' then
  local err = ARGV[7]
  if err == '' then err = nil end
  local meta = ARGV[8]
  if meta == '' then meta = nil end
  st.s, st.e, st.f, st.l, st.m = ARGV[6], err, num(now), nil, meta
  redis.call('SREM', KEYS[2], run_id)
  redis.call('ZADD', KEYS[3], ARGV[5], cjson.encode(
    {run = run_id, a = st.a, s = st.s, b = st.b, f = st.f, r = st.r, e = err, m = meta}))
else
  return redis.error_reply('anarchon: unknown lease operation ' .. op)
end
redis.call('HSET', KEYS[1], run_id, cjson.encode(st))
return 1
