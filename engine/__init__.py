"""mlxcel's engine: synchronous, pure MLX.

Model and tokenizer loading, KV caches with exact rewind, the sampler chain that builds
the target's effective distribution, acceptance rules, verify rounds, plain and
speculative decode. Nothing here knows about HTTP or asyncio.
"""
