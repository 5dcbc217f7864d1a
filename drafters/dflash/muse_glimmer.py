"""The Muse Glimmer assistant drafter: the DFlash round loop with an adaptive verify width.

The network is the DFlash one (``drafters.dflash.drafter``; the assistant's own checkpoint layout is
read by ``drafters.dflash.checkpoint``), with sliding-attention layers; its proposals are drawn per
masked slot under the request's sampler (the argmax at temperature 0), and ``q`` is returned.

Width: the assistant declares a depth of four rows (the pending token and three drafts), and a
round loop starts there (``DECLARED_DEPTH``). It widens to the requested ceiling (the block the
server or caller asks for) only when a measurement window of ``WINDOW_ROUNDS`` rounds pays for
it: the warm-up width must be saturated (mean accepted drafts per round at least ``SATURATION``
of its three). After widening, one more window is measured at the ceiling; if it accepted no
more per round than the warm-up width could have, the wider forward did not pay and the loop
settles back at four rows for the rest of the request.

Because the width changes, the verify round asks the exactness probe about *both* widths
(``probe_widths``) before it scores any block in one forward: probing only the ceiling would
let the warm-up width through unmeasured, and the forward width is exactly what selects the
matmul kernel.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from mlxcel.drafters.dflash.drafter import DFlashDrafter
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.proposal import Proposal

log = logging.getLogger(__name__)

DECLARED_DEPTH = 4  # verify rows: the pending token + 3 drafts
WINDOW_ROUNDS = 4
SATURATION = 0.75


class MuseGlimmerDrafter(DFlashDrafter):
    kind = "muse-glimmer"

    def start(self, sequence: Sequence[int], params: SamplerParams, seed: int) -> None:
        super().start(sequence, params, seed)
        self.rows = DECLARED_DEPTH
        self.widened = False
        self.settled = False
        self._window: list[int] = []
        self._ceiling_rows = DECLARED_DEPTH
        self.width_log: list[int] = []  # the verify width of every round (for tests and reports)

    def _ceiling(self, k: int) -> int:
        return max(1, min(k, self.spec.max_proposals)) + 1

    def probe_widths(self, k: int) -> tuple[int, ...]:
        """Every width this drafter may verify at for a requested block of ``k``."""
        ceiling = self._ceiling(k)
        return tuple(sorted({min(DECLARED_DEPTH, ceiling), ceiling}))

    def max_drafts(self, k: int) -> int:
        self._ceiling_rows = self._ceiling(k)
        return max(0, min(k, self.rows - 1, self.spec.max_proposals))

    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        proposal = super().propose(sequence, k)
        if proposal.tokens:
            self.width_log.append(len(proposal.tokens) + 1)
        return proposal

    def observe(self, sequence: Sequence[int], proposal: Proposal, accepted: int) -> None:
        if not proposal.tokens or self.settled:
            return
        self._window.append(accepted)
        if len(self._window) < WINDOW_ROUNDS:
            return
        mean = sum(self._window) / len(self._window)
        self._window = []
        warm_drafts = DECLARED_DEPTH - 1
        if not self.widened:
            if mean >= SATURATION * warm_drafts and self._ceiling_rows > DECLARED_DEPTH:
                self.rows, self.widened = self._ceiling_rows, True
                log.info("muse-glimmer drafter: warm-up width saturated (%.2f of %d drafts per round); widening "
                         "to %d rows", mean, warm_drafts, self.rows)
        elif mean <= warm_drafts:
            self.rows, self.settled = DECLARED_DEPTH, True
            log.info("muse-glimmer drafter: %d rows accepted %.2f drafts per round, no more than %d rows can; "
                     "staying at %d rows", self._ceiling_rows, mean, DECLARED_DEPTH, DECLARED_DEPTH)
