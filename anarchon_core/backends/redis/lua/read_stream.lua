-- anarchon: the newest entries of a stream, as plain arrays whatever the client.
-- KEYS: a stream; ARGV: count
return redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', ARGV[1])
