"""KV caches and the forwards that fill them: one sequence's cache with exact rewind (``kv_cache``,
``recurrent``), its prefill (``prefill``), many rows in one forward (``ragged``, ``batch``), and a
cache in a file (``cache_file``)."""
