"""Gemma 4's MTP assistant: a four-layer drafter that attends to the target's own KV cache.

The published checkpoints (``google/gemma-4-*-it-assistant``) are read by structure
(``model_type: gemma4_assistant``, ``architectures: [Gemma4AssistantForCausalLM]``,
``mtp.structure``). Layout, as the Hugging Face model class defines it:

* ``config.json``: ``backbone_hidden_size`` (the target's width), ``use_ordered_embeddings``,
  ``num_centroids``, ``centroid_intermediate_top_k``, ``tie_word_embeddings`` and a ``text_config``
  (a ``gemma4_text`` config: its ``hidden_size`` is the assistant's own, every layer KV-shared,
  ``layer_types`` sliding / full, the target's ``head_dim`` / ``global_head_dim`` and RoPE);
* ``model.layers.{i}.*``: Gemma 4 decoder layers with query projections only
  (``self_attn.{q_proj, q_norm, o_proj}``, the four layer norms, ``mlp.*``, ``layer_scalar``);
  ``model.norm``; ``model.embed_tokens`` (the assistant's own ``[V, hidden]`` table, used only as
  its tied output head; ``lm_head`` when untied);
* ``pre_projection`` (``2 * backbone -> hidden``), ``post_projection`` (``hidden -> backbone``);
* ``masked_embedding.centroids`` (``hidden -> num_centroids``) and ``masked_embedding.token_ordering``
  (a vocabulary permutation, ``num_centroids`` blocks of ``V / num_centroids`` token ids): the
  *centroid head* of the E2B / E4B assistants.

One draft step (what the reference implementations run; no KV cache of the drafter's own):
``x = pre_projection(concat(target_embed(token) * sqrt(backbone), h))``, then each layer attends
with queries RoPE'd at the position of the round's pending token to the K/V of the target's last
cache layer of the same type (sliding or full attention; with Gemma 4's KV sharing that is the
last layer that computes K/V), over the committed tokens only (sliding layers: those within the
window); ``model.norm``; logits from the centroid head (score the centroids, keep the top
``centroid_intermediate_top_k``, score their tokens against the output table, every other token
gets the smallest selected logit minus one) or the tied table. The next step feeds the drafted
token with ``post_projection`` of the same normed hidden, at the same query position. The first
step's ``h`` is the target's final normed hidden state at the last committed position.

Assumptions (no published checkpoint can be downloaded here): the tensor names above are the
Hugging Face module names; ``hidden_size_per_layer_input`` is 0 in assistant configs (the
published E2B assistant's is), and a config asking for per-layer inputs is refused; the first
step's hidden is the target's *normed* last hidden state, as mlx-vlm's port feeds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import gemma4_text

from mlxcel.drafters.draws import DraftDraws, draw_draft
from mlxcel.drafters.mtp.structure import is_gemma4_assistant
from mlxcel.engine.cache.kv_cache import read_keys_values
from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model.config_file import read_config_json
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.drafter import ModelDrafter
from mlxcel.engine.speculative.proposal import Proposal
from mlxcel.engine.speculative.target_features import TargetFeatures, inner_model, language_model

ASSISTANT_BLOCK = 3  # drafts per round by default (the reference block of four rows: pending + 3)


class CentroidHead(nn.Module):
    """The ordered-embedding output head: logits for the tokens of the best-scoring centroids only."""

    def __init__(self, hidden: int, vocab: int, num_centroids: int, top_k: int):
        super().__init__()
        if vocab % num_centroids:
            raise ModelLoadError(f"the centroid head splits {vocab} tokens into {num_centroids} centroids unevenly")
        self.num_centroids, self.top_k, self.vocab = num_centroids, top_k, vocab
        self.per_centroid = vocab // num_centroids
        self.centroids = nn.Linear(hidden, num_centroids, bias=False)
        self.token_ordering = mx.zeros((vocab,), dtype=mx.int32)
        self.freeze(keys=["token_ordering"], recurse=False)

    def __call__(self, h: mx.array, table: mx.array) -> mx.array:
        """``h`` ``[n, hidden]``, ``table`` ``[V, hidden]``: ``[n, V]`` logits."""
        n = h.shape[0]
        best = mx.argpartition(self.centroids(h), kth=-self.top_k, axis=-1)[:, -self.top_k:]  # [n, top_k]
        tokens = self.token_ordering.reshape(self.num_centroids, self.per_centroid)[best].reshape(n, -1)
        scores = (table[tokens] @ h[:, :, None])[..., 0]  # [n, top_k * per_centroid]
        floor = scores.min() - 1.0
        out = mx.full((n, self.vocab), floor, dtype=h.dtype)
        return mx.put_along_axis(out, tokens, scores.astype(h.dtype), axis=-1)


class Gemma4Assistant(nn.Module):
    """The assistant network (parameter names as the checkpoint's)."""

    def __init__(self, config: dict):
        super().__init__()
        text = dict(config["text_config"])
        if int(text.get("hidden_size_per_layer_input") or 0):
            raise ModelLoadError("a Gemma 4 assistant with per-layer inputs (hidden_size_per_layer_input > 0) is not "
                                 "supported")
        text["hidden_size_per_layer_input"] = 0
        text["num_kv_shared_layers"] = int(text["num_hidden_layers"])  # every layer reads the target's K/V
        self.args = gemma4_text.ModelArgs.from_dict(text)
        self.backbone = int(config["backbone_hidden_size"])
        hidden = self.args.hidden_size
        self.model = _Stack(self.args)
        self.pre_projection = nn.Linear(2 * self.backbone, hidden, bias=False)
        self.post_projection = nn.Linear(hidden, self.backbone, bias=False)
        self.tied = bool(config.get("tie_word_embeddings", True))
        if not self.tied:
            self.lm_head = nn.Linear(hidden, self.args.vocab_size, bias=False)
        if config.get("use_ordered_embeddings"):
            self.masked_embedding = CentroidHead(hidden, self.args.vocab_size, int(config["num_centroids"]),
                                                 int(config["centroid_intermediate_top_k"]))

    @property
    def layer_types(self) -> list[str]:
        return list(self.args.layer_types)

    def logits(self, h: mx.array) -> mx.array:
        table = self.lm_head.weight if not self.tied else self.model.embed_tokens.weight
        if "masked_embedding" in self:
            return self.masked_embedding(h, table)
        return h @ table.T

    def step(self, x: mx.array, kv: dict[str, tuple[mx.array, mx.array, mx.array | None]],
             position: int) -> tuple[mx.array, mx.array]:
        """``x`` ``[1, 1, 2 * backbone]``: (logits ``[1, V]``, the next step's hidden ``[1, 1, backbone]``)."""
        h = self.pre_projection(x)
        offset = mx.array(position)
        for layer in self.model.layers:
            keys, values, mask = kv[layer.layer_type]
            h, _, _ = layer(h, mask, None, per_layer_input=None, shared_kv=(keys, values), offset=offset)
        h = self.model.norm(h)
        return self.logits(h[0]), self.post_projection(h)


class _Stack(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [gemma4_text.DecoderLayer(args, i) for i in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


def load_assistant(path: str | Path, dtype: mx.Dtype = mx.float32) -> tuple[Gemma4Assistant, dict]:
    """Read a Gemma 4 assistant directory into a ready network (float32 on this CPU build, as targets)."""
    path = Path(path).expanduser()
    config = read_config_json(path, f"{path}: a Gemma 4 assistant is a directory with config.json and safetensors")
    if not is_gemma4_assistant(config):
        raise ModelLoadError(f"{path} is not a Gemma 4 assistant (model_type {config.get('model_type')!r})")
    for key in ("backbone_hidden_size", "text_config"):
        if key not in config:
            raise ModelLoadError(f"{path}: config.json lacks {key!r}")
    network = Gemma4Assistant(config)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path}: no *.safetensors weights next to config.json")
    weights: dict[str, mx.array] = {}
    for f in files:
        weights.update(mx.load(str(f)))
    if network.tied:
        weights.pop("lm_head.weight", None)
    for k in list(weights):
        if k == "masked_embedding.token_ordering":
            weights[k] = weights[k].astype(mx.int32)
        elif dtype is not None and mx.issubdtype(weights[k].dtype, mx.floating):
            weights[k] = weights[k].astype(dtype)
    try:
        network.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ModelLoadError(f"{path}: the Gemma 4 assistant's tensors do not match its config.json ({exc})") from exc
    mx.eval(network.parameters())
    network.eval()
    return network, config


class Gemma4AssistantDrafter(ModelDrafter):
    """Drafts with the Gemma 4 MTP assistant on the MTP round loop (``draft_kind`` ``mtp``)."""

    kind = "gemma4-assistant"
    feature_layers: tuple[int, ...] = ()  # reads the final normed hidden state only
    reads_target_cache = True
    declared_block = ASSISTANT_BLOCK

    def __init__(self, network: Gemma4Assistant, config: dict, path: Path | None = None):
        self.network = network
        self.config = config
        self.path = path
        self.target: Any = None
        self.cache_layers: dict[str, int] = {}  # layer type -> the target cache entry it reads
        self.embed = None
        self.embed_scale = 1.0
        self.hidden: mx.array | None = None  # the target's normed hidden at the last committed position
        self.committed = 0
        self.target_cache: list[Any] | None = None
        self.chain: SamplerChain | None = None
        self.seed = 0
        self.vocab = 0

    @classmethod
    def load(cls, path: str | Path, **_: Any) -> Gemma4AssistantDrafter:
        network, config = load_assistant(path)
        return cls(network, config, Path(path))

    # -- binding --------------------------------------------------------------------------------

    def bind(self, target_model: Any) -> None:
        inner = inner_model(target_model)
        args = getattr(language_model(target_model), "args", None)
        types = list(getattr(args, "layer_types", None) or [])
        if not types or not hasattr(args, "num_kv_shared_layers"):
            raise ModelLoadError("the Gemma 4 assistant drafts for Gemma 4 targets (it reads their K/V cache); this "
                                 f"target is {type(target_model).__module__}")
        width = int(inner.embed_tokens.weight.shape[-1]) if not hasattr(inner.embed_tokens, "scales") else None
        hidden = int(args.hidden_size)
        if hidden != self.network.backbone or (width is not None and width != hidden):
            raise ModelLoadError(f"the Gemma 4 assistant was trained for a {self.network.backbone}-wide target; this "
                                 f"target is {hidden} wide")
        if int(args.vocab_size) != int(self.network.args.vocab_size):
            raise ModelLoadError(f"the Gemma 4 assistant's vocabulary ({self.network.args.vocab_size}) is not the "
                                 f"target's ({args.vocab_size})")
        with_kv = len(types) - int(args.num_kv_shared_layers or 0)
        layers = {}
        for t in set(self.network.layer_types):
            owners = [i for i in range(with_kv) if types[i] == t]
            if not owners:
                raise ModelLoadError(f"the Gemma 4 assistant reads {t} K/V, which this target has none of")
            layers[t] = owners[-1]
        for own in self.network.model.layers:
            dims = (args.global_head_dim if own.layer_type == "full_attention" and args.global_head_dim
                    else args.head_dim)
            if own.self_attn.head_dim != dims:
                raise ModelLoadError(f"the Gemma 4 assistant's {own.layer_type} heads are {own.self_attn.head_dim} "
                                     f"wide, the target's K/V {dims}")
        self.cache_layers = layers
        self.window = int(args.sliding_window)
        self.embed = inner.embed_tokens
        self.embed_scale = float(getattr(inner, "embed_scale", hidden ** 0.5))
        self.vocab = int(args.vocab_size)
        self.target = target_model

    # -- state ----------------------------------------------------------------------------------

    def start(self, sequence: Sequence[int], params: SamplerParams, seed: int) -> None:
        if self.target is None:
            raise RuntimeError("bind the Gemma 4 assistant to its target before starting it")
        self.hidden, self.committed, self.target_cache = None, 0, None
        self.chain = SamplerChain(params, vocab_size=self.vocab)
        self.seed = seed

    @property
    def context_length(self) -> int:
        """Target positions whose features the drafter has been handed."""
        return self.committed

    def observe_target(self, features: TargetFeatures) -> None:
        if features.length:
            self.hidden = features.normed[-1:]
            self.committed += features.length

    def read_target_cache(self, cache: list[Any]) -> None:
        self.target_cache = cache

    def observe(self, sequence: Sequence[int], proposal: Proposal, accepted: int) -> None:
        """Nothing to rewind: the assistant keeps no cache of its own."""

    # -- drafting -------------------------------------------------------------------------------

    def _shared_kv(self, position: int) -> dict[str, tuple[mx.array, mx.array, mx.array | None]]:
        out = {}
        for t, i in self.cache_layers.items():
            keys, values, first = read_keys_values(self.target_cache[i])
            mask = None
            if t == "sliding_attention":
                # bidirectional window around the query: committed keys less than a window behind it
                pos = first + mx.arange(keys.shape[2])
                mask = ((position - pos) < self.window)[None, None, None, :]
            out[t] = (keys, values, mask)
        return out

    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        if k <= 0:
            return Proposal([])
        position = len(sequence) - 1  # the pending token's; the target cache holds everything before it
        if self.committed != position or self.hidden is None:
            raise RuntimeError(f"Gemma 4 assistant out of step: it has the features of {self.committed} tokens, the "
                               f"target cache holds {position}")
        if self.target_cache is None:
            raise RuntimeError("the Gemma 4 assistant reads the target's cache; the round did not hand it over")
        kv = self._shared_kv(position)
        h = self.hidden[None].astype(self.network.pre_projection.weight.dtype)  # [1, 1, backbone]
        token = int(sequence[-1])
        draws = DraftDraws(sequence)
        for _ in range(k):
            e = self.embed(mx.array([[token]])) * self.embed_scale
            logits, h = self.network.step(mx.concatenate([e.astype(h.dtype), h], axis=-1), kv, position)
            token, q = self._draw(logits[:, : self.vocab], draws.history, draws.position)
            draws.add(token, q)
        self.target_cache = None
        return draws.proposal()

    def _draw(self, logits: mx.array, history: list[int], position: int) -> tuple[int, mx.array | None]:
        """One draft: the argmax when greedy, else a draw from q (returned)."""
        return draw_draft(self.chain, logits, history, self.seed, position)
