"""The n-gram drafters' parameters, with upstream's defaults (llama.cpp ``common_params_speculative``),
so that ``--spec-ngram-*`` means here what it means there.

Light on purpose: the registry reads these while the command line is checked, before anything loads.
"""

from __future__ import annotations

from dataclasses import dataclass

CACHE_BLOCK = 8  # ngram-cache drafts at most this many tokens a round (upstream fixes it too)
CACHE_NGRAM_MIN = 1  # the context and dynamic caches hold n-grams of 1..4 tokens
CACHE_NGRAM_MAX = 4
STATIC_NGRAM = 2  # the static cache is read with the last 2 tokens only


@dataclass(frozen=True)
class NgramMapOptions:
    """``ngram-map-k`` / ``ngram-map-k4v``: a key of ``size_n`` tokens, a value (the draft) of up to
    ``size_m`` tokens; k4v drafts only after the key was looked up ``min_hits`` times (map-k, as
    upstream's, does not read ``min_hits``)."""

    size_n: int = 12
    size_m: int = 48
    min_hits: int = 1

    def check(self, flag: str) -> str | None:
        """Why these values are refused (upstream's own limits), or None."""
        if not 1 <= self.size_n <= 1024:
            return f"--spec-ngram-{flag}-size-n must be between 1 and 1024 (got {self.size_n})"
        if not 1 <= self.size_m <= 1024:
            return f"--spec-ngram-{flag}-size-m must be between 1 and 1024 (got {self.size_m})"
        if self.min_hits < 1:
            return f"--spec-ngram-{flag}-min-hits must be at least 1 (got {self.min_hits})"
        return None


@dataclass(frozen=True)
class NgramModOptions:
    """``ngram-mod``: keys of ``n_match`` tokens in one hashed table; a chain of lookups drafts up to
    ``n_max`` tokens, and nothing when it breaks before ``n_min``."""

    n_match: int = 24
    n_max: int = 64
    n_min: int = 48

    def check(self) -> str | None:
        if not 1 <= self.n_match <= 1024:
            return f"--spec-ngram-mod-n-match must be between 1 and 1024 (got {self.n_match})"
        if not 0 <= self.n_max <= 1024:
            return f"--spec-ngram-mod-n-max must be between 0 and 1024 (got {self.n_max})"
        if not 0 <= self.n_min <= 1024:
            return f"--spec-ngram-mod-n-min must be between 0 and 1024 (got {self.n_min})"
        return None


@dataclass(frozen=True)
class NgramCacheOptions:
    """``ngram-cache``: the files ``-lcs`` (static: a corpus's 2-gram statistics, never updated) and
    ``-lcd`` (dynamic: earlier generations' statistics) it reads at load, in upstream's file format
    (``cache_file``); None: none."""

    static_path: str | None = None
    dynamic_path: str | None = None
