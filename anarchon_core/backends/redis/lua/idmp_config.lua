-- anarchon idmp: apply IDMP-DURATION / IDMP-MAXSIZE to a job's stream (Redis 8.6+), only
-- when they differ from the stream's current values: XCFGSET clears the server's
-- idempotency memory, so it must never run again once claims flow. Atomic, so two
-- instances starting together cannot both change it.
-- KEYS: runs (stream); ARGV: duration_sec, max_size
-- Returns 1 if the configuration was changed, 0 if it already matched.
if redis.call('EXISTS', KEYS[1]) == 0 then
  -- create the empty stream (XCFGSET configures an existing stream)
  redis.call('XGROUP', 'CREATE', KEYS[1], 'anarchon-init', '$', 'MKSTREAM')
  redis.call('XGROUP', 'DESTROY', KEYS[1], 'anarchon-init')
end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local current = {}
for i = 1, #info - 1, 2 do current[info[i]] = info[i + 1] end
if tonumber(current['idmp-duration']) == tonumber(ARGV[1])
    and tonumber(current['idmp-maxsize']) == tonumber(ARGV[2]) then
  return 0
end
redis.call('XCFGSET', KEYS[1], 'IDMP-DURATION', ARGV[1], 'IDMP-MAXSIZE', ARGV[2])
return 1
