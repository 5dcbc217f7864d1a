"""Errors the engine raises for bad input. Each carries one human-readable message;
the CLI prints it without a traceback and the server turns it into an error body."""


class MlxcelError(Exception):
    """Base class: a problem with the user's input, not a bug."""


class ModelLoadError(MlxcelError):
    """The model could not be loaded: missing/corrupt file, unsupported architecture or tensor type."""


class UnsupportedQuantError(ModelLoadError):
    """A GGUF tensor uses a quantization type mlxcel cannot read."""


class CacheRewindError(MlxcelError):
    """A KV cache cannot be rewound by the requested number of tokens (e.g. past a sliding window)."""


class PromptError(MlxcelError):
    """The prompt is empty or cannot be tokenized."""
