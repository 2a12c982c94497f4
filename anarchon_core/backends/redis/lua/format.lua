-- anarchon store format: write the format record if absent and return the stored one.
-- KEYS: format; ARGV: this version's format
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
