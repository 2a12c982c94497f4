-- anarchon claim-only: the token of a run's claim entry, looked for from `from` (an entry
-- id) forward; the claim of a slot lies shortly after the slot's time.
-- KEYS: runs or manual (stream); ARGV: slot, from, count
-- Returns the token, or "" if no claim of that slot is found.
for _, entry in ipairs(redis.call('XRANGE', KEYS[1], ARGV[2], '+', 'COUNT', ARGV[3])) do
  local f = entry[2]
  if f[2] == ARGV[1] then return f[4] end
end
return ''
