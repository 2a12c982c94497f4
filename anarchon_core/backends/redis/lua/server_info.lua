-- anarchon: INFO server, read through a script so that every client returns plain text.
return redis.call('INFO', 'server')
