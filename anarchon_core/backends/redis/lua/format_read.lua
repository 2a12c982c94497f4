-- anarchon store format, read only (read-only backends): the stored format or nil.
-- KEYS: format
return redis.call('GET', KEYS[1])
