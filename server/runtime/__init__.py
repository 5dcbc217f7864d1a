"""The serving runtime: the scheduler that owns the one engine thread, slots, tasks and their
events, per-request speculation, timings and metrics. Knows nothing of HTTP routes."""
