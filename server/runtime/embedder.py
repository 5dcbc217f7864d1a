"""What ``--embeddings`` / ``--reranking`` / ``--pooling`` make of the loaded model, resolved once at
startup: the pooling, the rank head and the rerank prompt, and the two calls the routes run on
the engine thread (``Scheduler.call``).

Pooling: ``--reranking`` is rank pooling; otherwise ``--pooling``, else the model's own (a GGUF
file's ``{arch}.pooling_type``, a sentence-transformers directory's ``1_Pooling/config.json``),
else ``none``, which is llama.cpp's default for a model that names none. Rank pooling reads a rank
head (``engine.embedding.rank_head``); a model without one scores, as llama-server scores it, with
the first component of the summary token's hidden state (the last token's for a decoder, the
first's for an encoder), and a warning at startup says that this number ranks nothing in particular.

A BERT-family encoder (``engine.model.encoder``) is served for embeddings and rerank only: it has no
KV cache and no language-model head, so a completion request is refused (:meth:`Embedder.check_generates`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlxcel.engine.embedding.pooling import GGUF_POOLING, embed
from mlxcel.engine.embedding.rank_head import (
    QWEN3_RERANK_TEMPLATE,
    RankHead,
    gguf_rank_head,
    is_qwen3_reranker,
    yes_no_head,
)
from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.errors import not_supported, timed_out
from mlxcel.server.runtime.task import Deferred

log = logging.getLogger(__name__)

# sentence-transformers' pooling switches, in the order a config is read
_ST_MODES = (("pooling_mode_cls_token", "cls"), ("pooling_mode_mean_tokens", "mean"),
             ("pooling_mode_lasttoken", "last"))


def model_pooling(loaded: LoadedModel) -> str:
    """The pooling the checkpoint itself asks for ("none" when it says nothing)."""
    value = loaded.metadata.get("pooling_type")
    if isinstance(value, int) and value in GGUF_POOLING:
        return GGUF_POOLING[value]
    st = loaded.path / "1_Pooling" / "config.json" if loaded.path.is_dir() else None
    if st is not None and st.is_file():
        try:
            config = json.loads(st.read_text(encoding="utf-8"))
        except ValueError:
            config = {}
        for key, name in _ST_MODES:
            if config.get(key):
                return name
    return "none"


@dataclass
class Embedder:
    loaded: LoadedModel
    pooling: str
    normalization: int = 2  # --embd-normalize: the default of a request's embd_normalize
    head: RankHead | None = None
    rerank_template: str | None = None  # a reranker's own prompt, with {query} and {document}
    step: int = 512  # tokens per forward (--ubatch-size)

    @property
    def reranking(self) -> bool:
        return self.pooling == "rank"

    @property
    def encoder_only(self) -> bool:
        """Whether the model is an encoder, which embeds and scores but generates nothing."""
        return bool(self.loaded.metadata.get("encoder"))

    def check_generates(self) -> None:
        """Refuse a completion (any route that generates) on an encoder-only model: 501, with
        llama-server's reason (upstream answers it with a 500 once the task reaches a slot)."""
        if self.encoder_only:
            raise not_supported(
                f"the current context does not support logits computation: {self.loaded.name} is an "
                f"encoder-only ({self.loaded.metadata.get('architecture')}) model; it serves /embedding, "
                "/v1/embeddings and, with --reranking, /rerank")

    @classmethod
    def load(cls, config: ServerConfig, loaded: LoadedModel) -> Embedder | None:
        if not (config.embeddings or config.reranking):
            return None
        pooling = "rank" if config.reranking else (config.pooling or model_pooling(loaded))
        head, template = None, loaded.metadata.get("rerank_template")
        if pooling == "rank":
            head = gguf_rank_head(loaded.metadata.get("classifier_tensors") or {},
                                  str(loaded.metadata.get("architecture", "")))
            if head is None and loaded.source == "mlx" and is_qwen3_reranker(loaded.path, loaded.config):
                head = yes_no_head(loaded.model, loaded.tokenizer)
                template = template or QWEN3_RERANK_TEMPLATE
            if head is None:
                log.warning(
                    "--reranking: %s has no rank head, so (as llama-server) a score is the first component of the "
                    "%s token's hidden state, which ranks nothing in particular; a reranker GGUF carries cls.* "
                    "tensors (bge-reranker, Qwen3-Reranker converted by llama.cpp), a Qwen3-Reranker directory its "
                    "LM head's yes/no rows", loaded.path.name,
                    "first" if loaded.metadata.get("encoder") else "last")
            else:
                log.info("reranking with %s", head.source)
        log.info("embeddings on: pooling %s, normalisation %d", pooling, config.embd_normalize)
        return cls(loaded, pooling, config.embd_normalize, head, template, max(1, config.ubatch_size))

    def embedding_run(self, inputs: list[list[int]], normalization: int, timeout: float,
                      t_arrival: float) -> EmbeddingRun:
        """A request's inputs to embed on the engine thread (``Scheduler.call(run)``)."""
        return EmbeddingRun(lambda tokens: self.embed(tokens, normalization), inputs, self.step, timeout, t_arrival)

    def rerank_run(self, prompts: list[list[int]], timeout: float, t_arrival: float) -> EmbeddingRun:
        """A request's rerank prompts to score on the engine thread (``Scheduler.call(run)``)."""
        return EmbeddingRun(self.score, prompts, self.step, timeout, t_arrival)

    # -- engine thread ----------------------------------------------------------------------------

    def embed(self, tokens: list[int], normalization: int) -> np.ndarray:
        """One input's embedding (``[H]``, or ``[T, H]`` with pooling none)."""
        return embed(self.loaded.model, tokens, self.pooling, normalization=normalization, head=self.head,
                     step=self.step)

    def score(self, tokens: list[int]) -> float:
        """A rerank prompt's relevance score: the head's first output."""
        return float(embed(self.loaded.model, tokens, "rank", normalization=-1, head=self.head, step=self.step)[0])


def check_encoder_flags(config: ServerConfig, loaded: LoadedModel) -> None:
    """An encoder-only model serves embeddings or rerank and nothing else: without ``--embeddings``
    or ``--reranking`` it would answer no route, so the server does not start (llama-server starts
    and fails each request)."""
    if not (config.embeddings or config.reranking):
        raise ModelLoadError(
            f"{loaded.path} is an encoder-only ({loaded.metadata.get('architecture')}) model: it computes embeddings "
            "and rerank scores, not text; start the server with --embeddings (or --reranking for a reranker)")


# The most engine time one embedding request takes between two engine steps (after at least one
# input): a decode step of a running completion waits no longer than this for it.
SLICE_S = 0.05


class EmbeddingCancelled(Exception):
    """The request's client went away: its remaining inputs are dropped."""


class EmbeddingRun:
    """One request's inputs, computed on the engine thread a slice at a time.

    The run is a single ``Scheduler.call`` job that computes inputs until it has spent one
    ``--ubatch-size`` worth of tokens or :data:`SLICE_S` seconds, then raises ``Deferred`` so the
    engine steps its running completions before the next slice: a request of thousands of inputs
    neither starves the completions nor fills the queue with a job per input. Each slice first
    checks whether the run was cancelled (its client went away: :meth:`cancel`, from the event
    loop) or is past ``--timeout`` counted from the request's arrival, as a completion is, and then
    ends with the same 503 a completion gets, dropping the inputs not yet computed.
    """

    def __init__(self, compute: Callable[[list[int]], Any], inputs: list[list[int]], slice_tokens: int,
                 timeout: float, t_arrival: float):
        self._compute = compute
        self._inputs = inputs
        self._slice_tokens = max(1, slice_tokens)
        self._timeout = timeout
        self._deadline = t_arrival + timeout if timeout > 0 else None
        self._cancelled = threading.Event()
        self.results: list[Any] = []

    def cancel(self) -> None:
        """Drop the inputs not yet computed (any thread; the engine stops before its next slice)."""
        self._cancelled.set()

    def __call__(self) -> list[Any]:
        """One slice (engine thread): every result once the last input is done, else ``Deferred``."""
        if self._cancelled.is_set():
            log.info("embedding request dropped after %d of %d inputs: its client went away", len(self.results),
                     len(self._inputs))
            raise EmbeddingCancelled("the client went away")
        start = time.perf_counter()
        if self._deadline is not None and start > self._deadline:
            log.warning("embedding request ended after %d of %d inputs: past --timeout (%g s)",
                        len(self.results), len(self._inputs), self._timeout)
            raise timed_out(self._timeout)
        spent = 0
        while len(self.results) < len(self._inputs):
            if spent >= self._slice_tokens or time.perf_counter() - start >= SLICE_S:
                raise Deferred
            tokens = self._inputs[len(self.results)]
            self.results.append(self._compute(tokens))
            spent += len(tokens)
        return self.results
