-- anarchon: every field and value of a hash (the namespace's control records), as a flat
-- array: field, value, field, value...
-- KEYS: a hash
return redis.call('HGETALL', KEYS[1])
