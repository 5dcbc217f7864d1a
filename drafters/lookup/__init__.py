"""Prompt lookup: n-gram matches in the sequence itself (``prompt_lookup``) and the server's
governor that pauses rows whose lookups do not pay (``governor``)."""
