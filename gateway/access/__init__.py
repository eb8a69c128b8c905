"""Client access: who a key is (keys.py), what it may use and how fast (limiter.py, pure), where
the limit counters live (memory_store.py per replica, redis_store.py shared), and the one gate the
request path calls (gate.py)."""
