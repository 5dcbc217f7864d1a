"""The GGUF format: the file header and tensor index, tensor conversion, metadata to an mlx-lm
config, and the tokenizer rebuilt from the vocabulary. ``engine.model.gguf_loader`` assembles
them into a model."""
