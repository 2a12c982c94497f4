-- anarchon lease claim: the decision table of anarchon_core/decision.py, line for line.
-- KEYS: state (hash), active (set), slots (sorted set), runs (stream), results (sorted set)
-- ARGV: run_id, slot, manual (0/1), token, runner, lease_ms, overlap (0/1), max_attempts,
--       max_late_ms (-1: none), keep_ms, history_size, history_ttl_ms (-1: none),
--       LEASE_EXPIRED, GAVE_UP, OVERLAP_SKIP (the error texts of decision.py)
-- Returns {outcome, attempt, lease_until_ms or ""}.
if redis.replicate_commands then redis.replicate_commands() end
local state_key, active_key, slots_key, runs_key, results_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local run_id, slot_s, manual, token, runner = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local slot = tonumber(slot_s)
local lease_ms = tonumber(ARGV[6])
local overlap = ARGV[7] == '1'
local max_attempts = tonumber(ARGV[8])
local max_late = tonumber(ARGV[9])
local keep_ms = tonumber(ARGV[10])
local history_size = tonumber(ARGV[11])
local ttl = tonumber(ARGV[12])
local LEASE_EXPIRED, GAVE_UP, OVERLAP_SKIP = ARGV[13], ARGV[14], ARGV[15]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function num(x) return string.format('%.0f', x) end
local now_s = num(now)
-- results are scored slot*2+manual: one score per run (exact in a double until year 70000).
local function score_of(s, m) return num(tonumber(s) * 2 + (m == '1' and 1 or 0)) end
local score = score_of(slot_s, manual)
local finished = {success = true, failed = true, interrupted = true, skipped = true}

local function log_attempt(attempt, status)
  redis.call('XADD', runs_key, 'MAXLEN', '~', ARGV[11], '*', 'slot', slot_s, 'manual', manual,
             'attempt', attempt, 'status', status, 'runner', runner, 'token', token)
end

-- End the current attempt `st` with `status`: it gets its result entry (one per attempt).
-- An error noted while running (a hand-over on stop) is kept over `err`.
local function end_attempt(st, status, err)
  err = st.e or err
  st.s, st.e, st.f, st.l = status, err, now_s, nil
  redis.call('HSET', state_key, run_id, cjson.encode(st))
  redis.call('ZADD', results_key, score, cjson.encode(
    {run = run_id, a = st.a, s = status, b = st.b, f = now_s, r = st.r, e = err}))
end

local function record_skip(err)
  local st = {a = '1', s = 'skipped', t = token, r = runner, b = now_s, f = now_s, e = err}
  redis.call('HSET', state_key, run_id, cjson.encode(st))
  redis.call('ZADD', slots_key, slot_s, run_id)
  redis.call('ZADD', results_key, score, cjson.encode(
    {run = run_id, a = '1', s = 'skipped', b = now_s, f = now_s, r = runner, e = err}))
  log_attempt('1', 'skipped')
end

local function other_live()
  for _, id in ipairs(redis.call('SMEMBERS', active_key)) do
    if id ~= run_id then
      local raw = redis.call('HGET', state_key, id)
      if raw then
        local st = cjson.decode(raw)
        if st.s == 'running' and st.l and tonumber(st.l) > now then return true end
      else
        redis.call('SREM', active_key, id)
      end
    end
  end
  return false
end

-- Drop finished runs beyond history_size and history_ttl_ms; never a running run, nor one
-- a late claim could still ask for (slot within keep_ms of now).
local function drop(id, s)
  redis.call('HDEL', state_key, id)
  redis.call('ZREM', slots_key, id)
  local sc = score_of(s, string.sub(id, 1, 1) == 'm' and '1' or '0')
  redis.call('ZREMRANGEBYSCORE', results_key, sc, sc)
end

local function trim()
  local keep_after = now - keep_ms
  local excess = redis.call('ZCARD', slots_key) - history_size
  if excess > 0 then
    local n = math.min(excess, 100)
    local look = n + redis.call('SCARD', active_key)
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

local function start(attempt)
  local lease_until = num(now + lease_ms)
  local st = {a = tostring(attempt), s = 'running', l = lease_until, t = token, r = runner,
              b = now_s}
  redis.call('HSET', state_key, run_id, cjson.encode(st))
  redis.call('SADD', active_key, run_id)
  redis.call('ZADD', slots_key, slot_s, run_id)
  log_attempt(tostring(attempt), 'running')
  trim()
  return {'won', attempt, lease_until}
end

local raw = redis.call('HGET', state_key, run_id)
if not raw then
  if max_late >= 0 and now > slot + max_late then
    record_skip(string.format('late: first claimed %s ms after its time (max_late_ms=%s)',
                              num(now - slot), ARGV[9]))
    return {'late', 1, ''}
  end
  if not overlap and other_live() then
    record_skip(OVERLAP_SKIP)
    return {'overlap', 1, ''}
  end
  return start(1)
end
local st = cjson.decode(raw)
local attempt = tonumber(st.a)
if finished[st.s] then return {'done', attempt, ''} end
if st.l and tonumber(st.l) > now then return {'running', attempt, st.l} end
if attempt < max_attempts then
  end_attempt(st, 'interrupted', LEASE_EXPIRED)
  return start(attempt + 1)
end
end_attempt(st, 'interrupted', GAVE_UP)
redis.call('SREM', active_key, run_id)
return {'done', attempt, ''}
