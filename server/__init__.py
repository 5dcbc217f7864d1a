"""The llama-server-compatible server, in three layers that only import downward:
``cli`` (entry points, flags) -> ``http`` (routes, formats) -> ``runtime`` (scheduler, slots)."""
