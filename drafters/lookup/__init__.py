"""The n-gram drafters, upstream's ``ngram-*`` speculative types: prompt lookup (``prompt_lookup``, with
the server's ``governor``; ngram-simple), the key-to-value maps (``ngram_map``: map-k, map-k4v), the
shared hashed table (``ngram_mod``), the n-gram statistics cache (``ngram_cache`` over ``ngram_counts``,
with ``cache_file`` for -lcs / -lcd), several of them combined (``combined``), and the per-slot state
that lets them learn from a slot's earlier requests (``slot_source``)."""
