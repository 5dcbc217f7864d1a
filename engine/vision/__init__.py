"""Images in prompts: vision towers (mlx-vlm's modules) feeding mlx-lm text models.

A prompt with images is a token sequence in which each image holds as many positions as it has
embeddings (``prompt``); the chunks up to its last image are fed on their own cache with those
embeddings in place of the placeholder tokens' (``forward``), each token where its text model puts
it (``positions``: sequential, or Qwen's M-RoPE grid); everything after is plain text. ``image``
decodes the bytes a request sends, ``resize`` sizes them, ``families`` knows each served family
(Gemma 3, Qwen2.5-VL), ``tower`` is one loaded tower, ``loading`` loads it from an MLX checkpoint or
an mmproj GGUF (``gguf.mmproj``). mlx-vlm is imported only when a tower is built.
"""
