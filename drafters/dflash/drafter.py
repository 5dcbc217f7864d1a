"""The DFlash drafter: a block of mask tokens denoised in one parallel forward of a small network
conditioned on the target's hidden states (``drafters.dflash.network``), borrowing the target's
embedding table and LM head.

Round by round, with ``L = len(sequence)`` (the target cache holds ``L - 1`` tokens, the last
token is pending):

* context: the drafter has been handed the features of every token the target committed (the
  prompt after prefill, then after each round the pending token and the accepted drafts, via
  ``observe_target``); those not yet fed to the network wait in ``_pending`` and are fed with
  the next block. Invariant: ``context_length == L - 1`` at every ``propose``.
* ``propose(sequence, k)``: one forward over ``[pending, mask * k]`` at positions ``L - 1 ..
  L - 1 + k``; row ``i + 1`` scores the token at position ``L + i``. Under a greedy request the
  draft is the argmax of that row (after the request's bias and penalties); otherwise it is drawn
  from ``q_i`` = the row through the request's own sampler chain (history = the sequence plus the
  drafts before it), with the drafter's own key stream, and ``q`` is returned so modified
  rejection sampling can run.
* Nothing to undo afterwards: the context cache only ever holds committed tokens, and the
  block's own keys never enter it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxcel.drafters.dflash.checkpoint import load_dflash_checkpoint
from mlxcel.drafters.dflash.network import DFlashNetwork, DFlashSpec
from mlxcel.drafters.draws import DraftDraws, draw_draft
from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.drafter import ModelDrafter
from mlxcel.engine.speculative.proposal import Proposal
from mlxcel.engine.speculative.target_features import TargetFeatures, embed, head_logits, inner_model


class DFlashDrafter(ModelDrafter):
    kind = "dflash"

    def __init__(self, network: DFlashNetwork, spec: DFlashSpec, *, target_vocab_size: int | None = None,
                 eos_token_ids=(), tokenizer=None):
        self.network = network
        self.spec = spec
        self.feature_layers = tuple(spec.target_layer_ids)
        self.target_vocab_size = target_vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.tokenizer = tokenizer
        self.target: Any = None
        self.cache = None
        self._pending: list[mx.array] = []
        self._pending_rows = 0
        self.chain: SamplerChain | None = None
        self.seed = 0

    @property
    def declared_block(self) -> int:
        return self.spec.max_proposals

    @classmethod
    def load(cls, path: str | Path, **kwargs) -> DFlashDrafter:
        network, spec = load_dflash_checkpoint(path)
        return cls(network, spec, **kwargs)

    # -- binding and state ----------------------------------------------------------------------

    def bind(self, target_model: Any) -> None:
        inner = inner_model(target_model)
        n_layers = len(inner.layers)
        declared = self.spec.num_target_layers
        if declared is not None and int(declared) != n_layers:
            raise ModelLoadError(f"the {self.kind} drafter was trained on a {declared}-layer target; this target has "
                                 f"{n_layers} layers")
        bad = [i for i in self.feature_layers if not 0 <= i < n_layers]
        if bad:
            raise ModelLoadError(f"the {self.kind} drafter reads target layers {list(self.feature_layers)}, but the "
                                 f"target has {n_layers} layers")
        norm_weight = getattr(inner.norm, "weight", None)  # never quantized, unlike the embedding table
        width = int(norm_weight.shape[-1]) if norm_weight is not None else None
        if width is not None and width != self.spec.hidden_size:
            raise ModelLoadError(f"the {self.kind} drafter's hidden size {self.spec.hidden_size} does not match the "
                                 f"target's {width}; it was trained for another target")
        self.target = target_model

    def start(self, sequence: Sequence[int], params: SamplerParams, seed: int) -> None:
        if self.target is None:
            raise RuntimeError(f"the {self.kind} drafter must be bound to its target first")
        self.cache = self.network.make_cache()
        self._pending, self._pending_rows = [], 0
        vocab = self.target_vocab_size or int(self.spec.vocab_size or 0) or None
        self.chain = SamplerChain(params, vocab_size=vocab or self._vocab(), eos_token_ids=self.eos_token_ids,
                                  tokenizer=self.tokenizer)
        self.seed = seed

    def _vocab(self) -> int:
        return int(inner_model(self.target).embed_tokens.weight.shape[0])

    def observe_target(self, features: TargetFeatures) -> None:
        if features.length:
            self._pending.append(features.concat(self.feature_layers))
            self._pending_rows += features.length

    @property
    def context_length(self) -> int:
        """Committed tokens the drafter has been handed (fed or waiting)."""
        fed = self.cache[0].offset if self.cache else 0
        return fed + self._pending_rows

    def observe(self, sequence: Sequence[int], proposal: Proposal, accepted: int) -> None:
        """Nothing to rewind: the context only ever holds committed tokens (``observe_target``)."""

    # -- proposing --------------------------------------------------------------------------------

    def max_drafts(self, k: int) -> int:
        return min(k, self.spec.max_proposals)

    def _check_context(self, sequence: Sequence[int]) -> None:
        if self.context_length != len(sequence) - 1:
            raise RuntimeError(f"{self.kind} drafter out of step: it has the features of {self.context_length} tokens, "
                               f"the target cache holds {len(sequence) - 1}")

    def _block_hidden(self, block: list[int]) -> mx.array:
        """Feed the waiting context and the block; the block's normalised hidden states ``[L, H]``."""
        if self._pending:
            context = mx.concatenate(self._pending, axis=0)[None]
        else:
            context = mx.zeros((1, 0, len(self.feature_layers) * self.spec.hidden_size))
        self._pending, self._pending_rows = [], 0
        h = self.network(embed(self.target, block)[None], context, self.cache)[0]
        mx.eval(h, *[a for c in self.cache for a in c.state])
        return h

    def _rows_logits(self, hidden: mx.array) -> mx.array:
        logits = head_logits(self.target, hidden)
        if self.target_vocab_size and logits.shape[-1] > self.target_vocab_size:
            logits = logits[:, : self.target_vocab_size]
        return logits

    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        self._check_context(sequence)
        k = self.max_drafts(k)
        if k <= 0:
            return Proposal([])
        block = [int(sequence[-1])] + [self.spec.mask_token_id] * k
        logits = self._rows_logits(self._block_hidden(block)[1:])
        return self._draw_rows(logits, sequence)

    def _draw_rows(self, logits: mx.array, sequence: Sequence[int]) -> Proposal:
        """One draft per row: the argmax when greedy, else a draw from q (returned)."""
        draws = DraftDraws(sequence, self.grammar)
        for i in range(logits.shape[0]):
            if draws.done:
                break
            draws.add(*self._draw(draws.constrain(logits[i : i + 1]), draws.history, draws.position))
        return draws.proposal()

    def _draw(self, row: mx.array, history: list[int], position: int) -> tuple[int, mx.array | None]:
        """One draft for ``position`` from a ``[1, V]`` row (history already includes the drafts
        before it): the argmax when greedy, else a draw from q, returned with it."""
        return draw_draft(self.chain, row, history, self.seed, position)
