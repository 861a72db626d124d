"""Rate limits: token buckets for requests and tokens, and in-flight gates, per key, key x model and model.

    plan.py        which buckets a (key, model) pair touches, built once from the config (pure)
    bucket.py      the token-bucket arithmetic, shared by the memory limiter and mirrored by the Lua script
    limiter.py     the RateLimiter protocol: take from every bucket atomically (all or nothing), give back
    memory.py      one-process implementation (injected clock)
    redis_limiter.py  Redis implementation: one Lua script, Redis TIME as the clock, hash-tagged keys
    resp.py        the lean pipelined Redis connection the limiter's scripts use on a standalone Redis
    estimate.py    token estimate before a request and real usage after it, per route kind
    stream_usage.py  the usage chunk of an SSE stream (found without parsing every chunk, stripped on demand)
    service.py     what the proxy calls: admit (429 / 503 / headers), settle (release + reconcile)
    usage.py       usage accounting: hourly counters per key, model and day in Redis, and their reader
"""
