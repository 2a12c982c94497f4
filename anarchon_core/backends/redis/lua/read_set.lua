-- anarchon: the members of a set (the namespace's jobs), as a plain array.
-- KEYS: a set
return redis.call('SMEMBERS', KEYS[1])
