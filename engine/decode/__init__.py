"""Plain decoding: one sequence (``plain``: chunked prefill, one token per step), the server's
batched decode step (``batch``), and KV caches with exact rewind (``kv_cache``)."""
