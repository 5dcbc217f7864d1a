"""What an EAGLE-3 config.json says about its network, read from either published layout.

Where each layout keeps what (both describe the same network, ``network.py``):

* **EAGLE-3 authors' layout**: the decoder layer's Llama fields at the top level
  (``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``,
  ``rms_norm_eps``, ``rope_theta``, ``rope_scaling``, ``vocab_size`` = the target's vocabulary),
  with ``draft_vocab_size``, and optionally ``target_hidden_size``, ``norm_before_residual``
  (default off), ``norm_before_fc`` and ``eagle_aux_hidden_state_layer_ids`` (top level, or
  inside an ``eagle_config`` block as AngelSlim writes it).
* **speculators layout**: the same Llama fields inside ``transformer_layer_config``; the EAGLE-3
  fields at the top level, where ``norm_before_residual`` defaults to on (vLLM reads it so); the
  drafts per round in ``speculators_config.proposal_methods[].speculative_tokens``.

Which target layers it reads: ``eagle_aux_hidden_state_layer_ids`` when given, else, as vLLM and
llama.cpp both default, ``(2, N // 2, N - 3)`` of an ``N``-layer target (known only at bind).
An id ``a`` names the *input* of target decoder layer ``a`` (the residual stream entering it),
which is the output of layer ``a - 1``; ``a == N`` is the last layer's output before the final norm.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxcel.drafters.eagle3.structure import ORIGINAL, SPECULATORS, eagle3_layout
from mlxcel.engine.errors import ModelLoadError

DEFAULT_BLOCK = 3  # drafts per round when the checkpoint declares none (upstream's --spec-draft-n-max default)


@dataclass(frozen=True)
class Eagle3Spec:
    """The network and its wiring to the target."""

    layout: str
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    vocab_size: int | None  # the target's vocabulary, as the checkpoint knows it
    draft_vocab_size: int | None  # None: the target's
    target_hidden_size: int | None  # None: hidden_size
    aux_layer_ids: tuple[int, ...] | None  # None: the default trio of the target bound to
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    block: int = DEFAULT_BLOCK

    @property
    def fc_input(self) -> int | None:
        """Width of the fused target features, when the checkpoint says how many layers it reads."""
        if self.aux_layer_ids is None:
            return None
        return len(self.aux_layer_ids) * (self.target_hidden_size or self.hidden_size)


def default_aux_layers(n_layers: int) -> tuple[int, int, int]:
    """The low, middle and high target layers EAGLE-3 reads when its checkpoint does not name them."""
    return 2, n_layers // 2, n_layers - 3


def _need(config: dict, key: str, where: str):
    if config.get(key) is None:
        raise ModelLoadError(f"{where}: the EAGLE-3 config lacks {key!r}")
    return config[key]


def _aux_ids(config: dict, where: str) -> tuple[int, ...] | None:
    eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    if eagle.get("use_aux_hidden_state") is False:
        raise ModelLoadError(f"{where}: eagle_config.use_aux_hidden_state is off: an EAGLE-1/2 drafter (one target "
                             "hidden state), not EAGLE-3; mlxcel runs EAGLE-3 drafters")
    ids = config.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        return None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise ModelLoadError(f"{where}: eagle_aux_hidden_state_layer_ids must be a list of layer numbers, got {ids!r}")
    return tuple(ids)


def _declared_block(config: dict) -> int:
    """speculators' ``speculative_tokens`` of its default proposal method, else the default."""
    speculators = config.get("speculators_config") or {}
    methods = speculators.get("proposal_methods") or []
    wanted = speculators.get("default_proposal_method")
    for method in methods:
        if isinstance(method, dict) and (wanted is None or method.get("proposal_type") == wanted):
            tokens = method.get("speculative_tokens")
            if isinstance(tokens, int) and tokens > 0:
                return tokens
    return DEFAULT_BLOCK


def _layer_config(config: dict, layout: str, where: str) -> dict:
    """The decoder layer's own fields (speculators nests them), checked to be one Llama layer."""
    layer = config.get("transformer_layer_config") if layout == SPECULATORS else config
    if not isinstance(layer, dict):
        raise ModelLoadError(f"{where}: a speculators EAGLE-3 config needs transformer_layer_config")
    model_type = layer.get("model_type", "llama")
    if model_type != "llama":
        raise ModelLoadError(f"{where}: the EAGLE-3 decoder layer is a {model_type!r} layer; mlxcel runs the "
                             "Llama-style layer every published EAGLE-3 drafter uses")
    layers = int(layer.get("num_hidden_layers") or 1)
    if layers != 1:
        raise ModelLoadError(f"{where}: an EAGLE-3 drafter with {layers} decoder layers; mlxcel (as llama.cpp) runs "
                             "the one-layer form")
    return layer


def read_spec(config: dict, where: str = "drafter") -> Eagle3Spec:
    """The network description of an EAGLE-3 config.json in either layout."""
    layout = eagle3_layout(config)
    if layout not in (ORIGINAL, SPECULATORS):
        raise ModelLoadError(f"{where} is not an EAGLE-3 drafter config (no LlamaForCausalLMEagle3, Eagle3Speculator, "
                             "speculators_config for eagle3, or draft_vocab_size with one layer)")
    layer = _layer_config(config, layout, where)
    hidden = int(_need(layer, "hidden_size", where))
    heads = int(_need(layer, "num_attention_heads", where))
    scaling = layer.get("rope_scaling")
    if scaling and (scaling.get("rope_type") or scaling.get("type")) == "default":
        scaling = None
    vocab = layer.get("vocab_size") or config.get("vocab_size")
    draft_vocab = config.get("draft_vocab_size") or layer.get("draft_vocab_size")
    residual_default = layout == SPECULATORS
    return Eagle3Spec(
        layout=layout,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(layer.get("num_key_value_heads") or heads),
        head_dim=int(layer.get("head_dim") or hidden // heads),
        intermediate_size=int(_need(layer, "intermediate_size", where)),
        rms_norm_eps=float(layer.get("rms_norm_eps") or 1e-6),
        rope_theta=float(layer.get("rope_theta") or 10000.0),
        rope_scaling=scaling,
        max_position_embeddings=int(layer.get("max_position_embeddings") or 131072),
        vocab_size=int(vocab) if vocab else None,
        draft_vocab_size=int(draft_vocab) if draft_vocab else None,
        target_hidden_size=int(config["target_hidden_size"]) if config.get("target_hidden_size") else None,
        aux_layer_ids=_aux_ids(config, where),
        norm_before_residual=bool(config.get("norm_before_residual", residual_default)),
        norm_before_fc=bool(config.get("norm_before_fc", False)),
        attention_bias=bool(layer.get("attention_bias", False)),
        mlp_bias=bool(layer.get("mlp_bias", False)),
        block=_declared_block(config),
    )
