"""The LFM2 DSpark drafter: the DFlash network plus a low-rank Markov head, proposing a greedy chain.

Differences from DFlash (``drafters.dflash.drafter``), as the published checkpoints lay them out:

* every row of the block ``[pending, mask * (k - 1)]`` is a proposal: row ``i`` (at position
  ``L - 1 + i``) scores the token at position ``L + i``, so ``block_size`` counts proposals;
* the rows are scored in parallel, then chained: ``logits_i = base_i + markov_w2(markov_w1[prev])``
  with ``prev`` the previous draft (the pending token for row 0), and the draft is that row's
  argmax. The head was trained against greedy targets.

Greedy only (``greedy_only``): the chain is an argmax chain, so it has no proposal distribution to
offer a sampling request, and serving a sampling request the greedy stream would be biased. The
server declines such a request to plain decoding with one warning; ``engine.speculative.session`` does the
same offline.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from mlxcel.drafters.dflash.drafter import DFlashDrafter
from mlxcel.drafters.draws import DraftDraws
from mlxcel.engine.speculative.proposal import Proposal


class DSparkDrafter(DFlashDrafter):
    kind = "dspark"
    greedy_only = True
    provides_distribution = False

    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        self._check_context(sequence)
        k = self.max_drafts(k)
        if k <= 0:
            return Proposal([])
        if not self.chain.greedy:
            raise RuntimeError("the DSpark drafter proposes greedy chains only; decline sampling requests")
        block = [int(sequence[-1])] + [self.spec.mask_token_id] * (k - 1)
        base = self._rows_logits(self._block_hidden(block))  # [k, V]
        vocab = base.shape[-1]
        draws = DraftDraws(sequence, self.grammar)
        for i in range(k):  # the Markov head's bias follows the previous token (the pending one, then each draft)
            if draws.done:
                break
            bias = self.network.markov_head(mx.array([draws.history[-1]]))[:, :vocab]
            draws.add(*self._draw(draws.constrain(base[i : i + 1] + bias), draws.history, draws.position))
        return draws.proposal()
