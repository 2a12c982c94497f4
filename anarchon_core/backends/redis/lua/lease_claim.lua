-- anarchon lease claim: the decision table of anarchon_core/decision.py, line for line.
-- KEYS: state (hash), active (set), slots (sorted set), runs (stream), results (sorted set)
-- ARGV: token, runner, and the numbers in one space-separated argument (fewer arguments
--       to encode on every claim): slot manual(0/1) lease_ms overlap(0 skip, 1 allow,
--       2 buffer_one, 3 cancel_other) max_attempts max_late_ms(-1: none) keep_ms
--       history_size history_ttl_ms(-1: none) trim(0/1: whether a started attempt trims the
--       job's old history; the caller draws it); and, for a "missed" request (account for a
--       slot nobody claimed; never run it), its reason
-- Returns {outcome, attempt, lease_until_ms or "", {run_id, ...}}: the last item lists the
-- runs whose state is corrupt (not JSON, unknown status) met on the way; they are skipped,
-- never taken over, and the caller reports them. A won or buffered claim that met none
-- leaves it out. A waiting attempt (overlap buffer_one/cancel_other) and a cancelled one are
-- running states whose error note `e` says so (decision.WAITING, WAITING_HANDED_OVER,
-- CANCELLED). The error texts below are decision.py's, put in when the script is loaded.
-- Lua 5.1 makes a script's local functions anew on every call, so the helpers of the rarer
-- paths (skips, takeovers, trimming) are made only on those paths.
local LEASE_EXPIRED = "@LEASE_EXPIRED@"
local GAVE_UP = "@GAVE_UP@"
local OVERLAP_SKIP = "@OVERLAP_SKIP@"
local WAITING = "@WAITING@"
local WAITING_HANDED_OVER = "@WAITING_HANDED_OVER@"
local CANCELLED = "@CANCELLED@"
local ALREADY_BUFFERED = "@ALREADY_BUFFERED@"
local EARLY_TOLERANCE_MS = tonumber("@EARLY_TOLERANCE_MS@")
local MAX_LEASE_AHEAD_MS = tonumber("@MAX_LEASE_AHEAD_MS@")
if redis.replicate_commands then redis.replicate_commands() end
local P = {string.match(ARGV[3],
  '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+)$')}
if not P[10] then
  return redis.error_reply('anarchon: malformed lease claim numbers ' .. tostring(ARGV[3]))
end
local slot_s, manual, policy = P[1], P[2], P[4]
if policy ~= '0' and policy ~= '1' and policy ~= '2' and policy ~= '3' then
  return redis.error_reply('anarchon: unknown overlap policy ' .. policy)
end
local run_id = manual == '1' and 'm' .. slot_s or slot_s
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local corrupt = {}
-- A run's state, or nil if it is not a state anarchon wrote (reported, never taken over).
local function decode(id, text)
  local ok, value = pcall(cjson.decode, text)
  if ok and type(value) == 'table' and tonumber(value.a) and
      (value.s == 'running' or value.s == 'success' or value.s == 'failed' or
       value.s == 'interrupted' or value.s == 'skipped' or value.s == 'missed') and
      (value.s ~= 'running' or value.l == nil or tonumber(value.l)) then
    return value
  end
  corrupt[#corrupt + 1] = id
  return nil
end

-- State present: the read-only answers first (the path every backup's check takes).
local raw = redis.call('HGET', KEYS[1], run_id)
local st
if raw then
  st = decode(run_id, raw)
  if not st then return {'done', 0, '', corrupt} end
  local s = st.s
  if s ~= 'running' then
    return {'done', tonumber(st.a), '', corrupt}
  end
  -- a missed request never takes a run over
  if ARGV[4] then return {'running', tonumber(st.a), st.l or '', corrupt} end
  if st.t == ARGV[1] then
    -- the caller's own claim, retried after its answer was lost; a waiting or cancelled
    -- attempt's own claim goes on below
    local e = st.e
    if e ~= CANCELLED and e ~= WAITING and e ~= WAITING_HANDED_OVER then
      return {'won', tonumber(st.a), st.l or '', corrupt}
    end
  elseif st.l and tonumber(st.l) > now then
    return {'running', tonumber(st.a), st.l, corrupt}
  end
end

local state_key, active_key, slots_key, runs_key, results_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, runner = ARGV[1], ARGV[2]
local function num(x) return string.format('%.0f', x) end
local now_s = num(now)

local function log_attempt(attempt, status)
  redis.call('XADD', runs_key, 'MAXLEN', '~', P[8], '*', 'slot', slot_s, 'manual', manual,
             'attempt', attempt, 'status', status, 'runner', runner, 'token', token)
end

-- The score of a run's results, slot*2+manual: one score per run (exact in a double until
-- year 70000).
local function score_of(s, m) return num(tonumber(s) * 2 + (m == '1' and 1 or 0)) end

-- Drop finished runs beyond history_size and history_ttl_ms; never a running run, nor one
-- a late claim could still ask for (slot within keep_ms of now).
local function trim()
  local keep_ms, history_size, ttl = tonumber(P[7]), tonumber(P[8]), tonumber(P[9])
  local function drop(id, s)
    redis.call('HDEL', state_key, id)
    redis.call('ZREM', slots_key, id)
    local sc = score_of(s, string.sub(id, 1, 1) == 'm' and '1' or '0')
    redis.call('ZREMRANGEBYSCORE', results_key, sc, sc)
  end
  local keep_after = now - keep_ms
  local excess = redis.call('ZCARD', slots_key) - history_size
  if excess > 0 then
    local n = math.min(excess, 100)
    -- look past running runs among the oldest, but boundedly (they stay; trimming
    -- resumes past them on later claims)
    local look = n + math.min(redis.call('SCARD', active_key), 100)
    local old = redis.call('ZRANGE', slots_key, 0, look - 1, 'WITHSCORES')
    local dropped = 0
    for i = 1, #old, 2 do
      if dropped >= n or tonumber(old[i + 1]) >= keep_after then break end
      if redis.call('SISMEMBER', active_key, old[i]) == 0 then
        drop(old[i], old[i + 1])
        dropped = dropped + 1
      end
    end
  end
  if ttl >= 0 then
    local cutoff = math.min(now - ttl, keep_after)
    local old = redis.call('ZRANGEBYSCORE', slots_key, '-inf', '(' .. num(cutoff),
                           'WITHSCORES', 'LIMIT', 0, 100)
    for i = 1, #old, 2 do
      if redis.call('SISMEMBER', active_key, old[i]) == 0 then drop(old[i], old[i + 1]) end
    end
    redis.pcall('XTRIM', runs_key, 'MINID', '~', num(cutoff))  -- Redis 6.2+; else MAXLEN only
  end
end

-- Store attempt `attempt` with a fresh lease: won, or buffered for a waiting one (its
-- `note` WAITING; decision.Action.WAIT).
local function start(attempt, note)
  local lease_until = num(now + tonumber(P[3]))
  local rec = {a = tostring(attempt), s = 'running', l = lease_until, t = token, r = runner,
               b = now_s, e = note}
  redis.call('HSET', state_key, run_id, cjson.encode(rec))
  redis.call('SADD', active_key, run_id)
  redis.call('ZADD', slots_key, slot_s, run_id)
  log_attempt(tostring(attempt), 'running')
  if P[10] == '1' then trim() end
  local outcome = note and 'buffered' or 'won'
  if corrupt[1] then return {outcome, attempt, lease_until, corrupt} end
  return {outcome, attempt, lease_until}
end

-- The job's other runs (decision.lease_is_live): whether one holds a live lease, whether a
-- live one waits (WAITING), and, when `upto` is 'all', every running one whose lease ends
-- after now (the runs cancel_other marks). A lease further ahead of the clock than anarchon
-- writes is corrupt, ignored (and reported), never a reason to skip every later slot of
-- the job. The scan stops at the first live run ('live'), at the first waiting one
-- ('waiting'), or goes through the job's active set ('all').
local function other_live(upto)
  local live, waiting, held = false, false, {}
  for _, id in ipairs(redis.call('SMEMBERS', active_key)) do
    if id ~= run_id then
      local other = redis.call('HGET', state_key, id)
      if other then
        local o = decode(id, other)
        local l = o and o.s == 'running' and tonumber(o.l)
        if l and l > now then
          if upto == 'all' then held[#held + 1] = {id, o} end
          if l <= now + MAX_LEASE_AHEAD_MS then
            live = true
            if o.e == WAITING then waiting = true end
            if upto == 'live' or (upto == 'waiting' and waiting) then break end
          else
            corrupt[#corrupt + 1] = id
          end
        end
      else
        redis.call('SREM', active_key, id)
      end
    end
  end
  return live, waiting, held
end

if not st then
  local slot, max_late = tonumber(slot_s), tonumber(P[6])
  if manual ~= '1' and slot > now + EARLY_TOLERANCE_MS then return {'early', 0, '', corrupt} end
  local function record_skip(err, status)
    status = status or 'skipped'
    local rec = {a = '1', s = status, t = token, r = runner, b = now_s, f = now_s, e = err}
    redis.call('HSET', state_key, run_id, cjson.encode(rec))
    redis.call('ZADD', slots_key, slot_s, run_id)
    redis.call('ZADD', results_key, score_of(slot_s, manual), cjson.encode(
      {run = run_id, a = '1', s = status, b = now_s, f = now_s, r = runner, e = err}))
    log_attempt('1', status)
  end
  if ARGV[4] then
    record_skip(ARGV[4], 'missed')
    return {'late', 1, '', corrupt}
  end
  if max_late >= 0 and now > slot + max_late then
    record_skip(string.format('late: first claimed %s ms after its time (max_late_ms=%s)',
                              num(now - slot), P[6]))
    return {'late', 1, '', corrupt}
  end
  if policy ~= '1' then
    local live, waiting, held = other_live(
      policy == '2' and 'waiting' or policy == '3' and 'all' or 'live')
    if live then
      if policy == '0' then
        record_skip(OVERLAP_SKIP)
        return {'overlap', 1, '', corrupt}
      end
      if policy == '2' then
        -- buffer_one: one waiting slot per job; a later one is skipped
        if waiting then
          record_skip(ALREADY_BUFFERED)
          return {'overlap', 1, '', corrupt}
        end
      else
        -- cancel_other: the other live runs are noted cancelled (their heartbeats are
        -- refused from now on; their leases are left as they are)
        for _, h in ipairs(held) do
          h[2].e = CANCELLED
          redis.call('HSET', state_key, h[1], cjson.encode(h[2]))
        end
      end
      return start(1, WAITING)
    end
  end
  return start(1)
end

-- End the current attempt (it gets its result entry, one per attempt; an error noted
-- while running, a hand-over on stop, a wait, a cancellation, is kept over `err`).
local function end_attempt(cur, status, err)
  err = cur.e or err
  cur.s, cur.e, cur.f, cur.l = status, err, now_s, nil
  redis.call('HSET', state_key, run_id, cjson.encode(cur))
  redis.call('ZADD', results_key, score_of(slot_s, manual), cjson.encode(
    {run = run_id, a = cur.a, s = status, b = cur.b, f = now_s, r = cur.r, e = err}))
end
-- interrupted for good: the run leaves the job's active runs
local function give_up(err)
  end_attempt(st, 'interrupted', err)
  redis.call('SREM', active_key, run_id)
  return {'done', tonumber(st.a), '', corrupt}
end
local attempt = tonumber(st.a)
local note = st.e
local waiting = note == WAITING or note == WAITING_HANDED_OVER
-- running, the caller's own token: a cancelled attempt ends; a waiting one starts once no
-- other run of the job holds a live lease (its note cleared, a fresh lease), else it waits
if st.t == token then
  if note == CANCELLED then return give_up(CANCELLED) end
  if other_live('live') then return {'buffered', attempt, st.l or '', corrupt} end
  st.e, st.l = nil, num(now + tonumber(P[3]))
  redis.call('HSET', state_key, run_id, cjson.encode(st))
  if corrupt[1] then return {'won', attempt, st.l, corrupt} end
  return {'won', attempt, st.l}
end
-- running, lease expired
if note == CANCELLED then return give_up(CANCELLED) end
local can_retry = attempt < tonumber(P[5])
local live = (policy ~= '1' or waiting) and other_live('live')
if waiting and can_retry and live then
  -- the next attempt waits on (the ended one keeps its note)
  end_attempt(st, 'interrupted')
  return start(attempt + 1, WAITING)
end
-- no two runs of a job at once but under overlap allow: taken over once the other ends
if live and policy ~= '1' and not waiting then return {'running', attempt, st.l or '', corrupt} end
if can_retry then
  end_attempt(st, 'interrupted', LEASE_EXPIRED)
  return start(attempt + 1)
end
return give_up(GAVE_UP)
