"""Loading a model: what ``-m`` / ``--hf-repo`` / nothing resolves to, MLX / Hugging Face
directories through mlx-lm, GGUF files through ``engine.gguf``, and the ``LoadedModel`` every
other layer holds."""
