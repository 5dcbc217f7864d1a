"""Response formats: how each API parses a completion request into the one plan and shapes the
results, streamed or not. Every completion-style route runs the one pipeline (``pipeline``) with
one of these; a new API is a new module here, not a new loop."""
