"""BERT-family encoders (``bert``, ``nomic-bert``, ``jina-bert-v2`` GGUF files) run by mlxcel's own
MLX network: embedding and rerank models, which have no KV cache and generate no text."""
