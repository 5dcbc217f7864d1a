"""A target forward that also returns the hidden states model-based drafters condition on.

DFlash-family drafters and MTP heads read the target's own hidden states: the outputs of chosen
decoder layers (DFlash concatenates a few of them), the last hidden state before the final norm,
and the normalised one the LM head reads. mlx-lm's models return logits only, so this module
runs the model's *own* ``__call__`` (its masks, caches, embedding scaling and head exactly as
mlx-lm wrote them) while recording what those modules produce: for the duration of one call,
each chosen entry of ``model.model.layers`` and ``model.model.norm`` is stood in for by a thin
recorder that calls the real module and keeps its output. The logits are therefore the very
array ``model(tokens, cache=cache)`` computes, bit for bit (the tests pin it), on any mlx-lm
model laid out as ``model.model.{embed_tokens, layers, norm}`` (llama, qwen2, qwen3, muse
glimmer, gemma, qwen3_next), with the decoder stack under ``language_model`` (qwen3_5,
gemma4), or with the final norm named ``embedding_norm`` (lfm2). A decoder layer that returns a
tuple (gemma4: hidden, shared K/V, offset) is read at its first element. Written here because
mlx-lm has no hidden-state output.

Also here: what a drafter borrows from its target when it binds (``embed_tokens``, and the head
that turns a normalised hidden state into logits the way the target does).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from mlxcel.engine.cache.batch import last_row_head, plain_head
from mlxcel.engine.errors import MlxcelError


class FeaturesUnsupported(MlxcelError):
    """The target's module layout has no decoder layer list / final norm to read."""


@dataclass
class TargetFeatures:
    """One forward's outputs, one row per input token (batch 1).

    ``logits`` ``[T, V]`` (None when not wanted, e.g. a prefill chunk); ``layers[i]`` ``[T, H]``:
    the output of decoder layer ``i`` (Hugging Face's ``hidden_states[i + 1]``); ``hidden``
    ``[T, H]``: the last layer's output, before the final norm; ``normed`` ``[T, H]``: after it."""

    logits: mx.array | None
    layers: dict[int, mx.array] = field(default_factory=dict)
    hidden: mx.array | None = None
    normed: mx.array | None = None

    @property
    def length(self) -> int:
        for a in (self.hidden, self.normed, self.logits, *self.layers.values()):
            if a is not None:
                return int(a.shape[0])
        return 0

    def concat(self, layer_ids: Sequence[int]) -> mx.array:
        """``[T, len(layer_ids) * H]``: the chosen layers' outputs side by side (DFlash's input)."""
        return mx.concatenate([self.layers[i] for i in layer_ids], axis=-1)

    def rows(self, start: int, stop: int) -> TargetFeatures:
        """The rows ``start:stop`` of every field."""

        def cut(a):
            return None if a is None else a[start:stop]

        return TargetFeatures(cut(self.logits), {i: a[start:stop] for i, a in self.layers.items()},
                              cut(self.hidden), cut(self.normed))

    @staticmethod
    def join(parts: Sequence[TargetFeatures]) -> TargetFeatures:
        """Rows of several forwards, in order (fields missing from any part are dropped)."""
        parts = [p for p in parts if p.length]
        if not parts:
            return TargetFeatures(None)
        if len(parts) == 1:
            return parts[0]

        def cat(arrays):
            return None if any(a is None for a in arrays) else mx.concatenate(arrays, axis=0)

        ids = set(parts[0].layers)
        for p in parts[1:]:
            ids &= set(p.layers)
        return TargetFeatures(cat([p.logits for p in parts]), {i: cat([p.layers[i] for p in parts]) for i in ids},
                              cat([p.hidden for p in parts]), cat([p.normed for p in parts]))

    def compact(self) -> TargetFeatures:
        """What a drafter can read, without the logits and the pre-norm hidden states (none reads
        them after the round that produced them): what a server slot keeps for prompt reuse."""
        return TargetFeatures(None, dict(self.layers), None, self.normed)

    def arrays(self) -> list[mx.array]:
        """Every array held (to evaluate them together)."""
        return [a for a in (self.logits, self.hidden, self.normed, *self.layers.values()) if a is not None]


FINAL_NORMS = ("norm", "embedding_norm")  # what mlx-lm's decoder stacks call their last norm


def language_model(model: Any) -> Any:
    """The text model of a multimodal wrapper (``language_model``: qwen3_5, gemma4), else ``model``."""
    return getattr(model, "language_model", model)


def inner_model(model: Any) -> Any:
    """The decoder stack (``model.model``) holding ``embed_tokens``, ``layers`` and the final norm."""
    inner = getattr(language_model(model), "model", None)
    if inner is None or not isinstance(getattr(inner, "layers", None), list) or norm_name(inner) is None:
        raise FeaturesUnsupported(
            f"a {type(model).__module__} model has no model.layers / model.norm to read hidden states from; "
            "model-based drafters need a target laid out like mlx-lm's llama/qwen models")
    return inner


def norm_name(inner: Any) -> str | None:
    """The attribute holding the decoder stack's final norm."""
    return next((n for n in FINAL_NORMS if getattr(inner, n, None) is not None), None)


def final_norm(model: Any) -> Any:
    """The target's final norm module (what turns the last layer's output into the head's input)."""
    inner = inner_model(model)
    return getattr(inner, norm_name(inner))


def _hidden(output: Any) -> mx.array:
    """A decoder layer's hidden-state output (gemma4's layers return (hidden, kv, offset))."""
    return output[0] if isinstance(output, tuple) else output


def num_layers(model: Any) -> int:
    return len(inner_model(model).layers)


class _Recorder:
    """Stands in for one module during a forward: calls it and keeps what it saw."""

    def __init__(self, module: Any, keep_input: bool = False):
        self._module = module
        self._keep_input = keep_input
        self.input = None
        self.output = None

    def __call__(self, x, *args, **kwargs):
        if self._keep_input:
            self.input = x
        self.output = self._module(x, *args, **kwargs)
        return self.output

    def __getattr__(self, name):  # the model reads layer attributes (use_sliding, self_attn...)
        return getattr(self._module, name)


@contextmanager
def _recording(model: Any, layer_ids: Sequence[int]):
    inner = inner_model(model)
    n = len(inner.layers)
    bad = [i for i in layer_ids if not 0 <= int(i) < n]
    if bad:
        raise FeaturesUnsupported(f"the drafter reads target layers {bad}, but the target has {n} layers")
    originals = list(inner.layers)
    name = norm_name(inner)
    original_norm = getattr(inner, name)
    recorders = {int(i): _Recorder(originals[int(i)]) for i in layer_ids}
    norm = _Recorder(original_norm, keep_input=True)
    layers = list(originals)
    for i, r in recorders.items():
        layers[i] = r
    # Item assignment: an mlx Module is a dict of its children, and this keeps the swap (and the
    # restore) off Module.__setattr__'s attribute bookkeeping.
    inner["layers"] = layers
    inner[name] = norm
    try:
        yield recorders, norm
    finally:
        inner["layers"] = originals
        inner[name] = original_norm


def forward_with_features(model: Any, tokens: Sequence[int] | mx.array, cache: list[Any],
                          layer_ids: Sequence[int] = (), *, logits: bool = True) -> TargetFeatures:
    """Run ``model(tokens[None], cache=cache)`` and return its logits (``logits=False``: not
    evaluated, and None) with the chosen layers' outputs and the final hidden states."""
    x = tokens if isinstance(tokens, mx.array) else mx.array([int(t) for t in tokens])
    if x.ndim == 1:
        x = x[None]
    with _recording(model, layer_ids) as (recorders, norm):
        out = model(x, cache=cache)
    return TargetFeatures(out[0] if logits else None, {i: _hidden(r.output)[0] for i, r in recorders.items()},
                          norm.input[0], norm.output[0])


def chunk_with_features(model: Any, tokens: Sequence[int], cache: list[Any],
                        layer_ids: Sequence[int] = ()) -> tuple[mx.array, TargetFeatures]:
    """One prefill chunk, as ``cache.batch.forward_chunk`` runs it (the last position's logits
    ``[V]``, computed as that function computes them, so a chunk's first sampled token is the same
    bits either way), that also returns every position's features (``logits`` None). Both are
    evaluated, with the cache. What the server's slots prefill with when the request will speculate
    with a model-based drafter: the drafter's context then comes from the request's own prefill."""
    x = mx.array([[int(t) for t in tokens]])
    with _recording(model, layer_ids) as (recorders, norm):
        out = model(x, cache=cache)
    features = TargetFeatures(None, {i: _hidden(r.output)[0] for i, r in recorders.items()}, norm.input[0],
                              norm.output[0])
    logits = last_row_head(model, norm.output) if plain_head(model) else out[0, -1]
    mx.eval(logits, [c.state for c in cache], features.arrays())
    return logits, features


def prefill_with_features(model: Any, tokens: Sequence[int], cache: list[Any], layer_ids: Sequence[int] = (),
                          step: int = 512) -> TargetFeatures:
    """``cache.prefill`` that also keeps every position's features: chunks of ``step`` tokens,
    then the last token alone (so its logits come from the same one-token forward plain decoding
    runs). ``logits`` holds the last row only."""
    tokens = [int(t) for t in tokens]
    if not tokens:
        return TargetFeatures(None)
    step = max(1, int(step))
    parts = []
    head = tokens[:-1]
    for i in range(0, len(head), step):
        part = forward_with_features(model, head[i:i + step], cache, layer_ids, logits=False)
        mx.eval([c.state for c in cache] + part.arrays())
        parts.append(part)
    last = forward_with_features(model, tokens[-1:], cache, layer_ids)
    joined = TargetFeatures.join([*parts, TargetFeatures(None, last.layers, last.hidden, last.normed)])
    joined.logits = last.logits
    return joined


def embed(model: Any, tokens: Sequence[int] | mx.array) -> mx.array:
    """The target's raw token embeddings ``[T, H]`` (what a DFlash drafter feeds its block with)."""
    x = tokens if isinstance(tokens, mx.array) else mx.array([int(t) for t in tokens])
    return inner_model(model).embed_tokens(x)


def head_logits(model: Any, normed: mx.array) -> mx.array:
    """Logits from normalised hidden states, as the target's own head computes them: ``lm_head``
    or the tied embedding, then the output multiplier and logit soft-capping some models apply."""
    lm = language_model(model)
    args = getattr(lm, "args", None)
    if hasattr(lm, "lm_head"):
        out = lm.lm_head(normed)
    else:
        out = inner_model(model).embed_tokens.as_linear(normed)
    mult = getattr(args, "output_multiplier", None)
    if mult is not None:
        out = out * mult
    cap = getattr(args, "final_logit_softcapping", None) or getattr(lm, "final_logit_softcapping", None)
    if cap:
        out = mx.tanh(out / cap) * cap
    return out
