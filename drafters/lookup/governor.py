"""The server's prompt-lookup governor: when a row's lookups are not worth a verify forward.

A verify round over ``k`` drafts costs a wider target forward than a plain step. On text that
does not repeat, prompt lookup still finds short n-gram matches whose continuations the target
rejects, and the row pays that width for nothing. The governor watches what each drafted round
yields and pauses the row when it stops paying for itself. It never touches the acceptance rule:
a paused row decodes plainly, so the emitted tokens are the same either way; only the cost moves.

Yield of a round: ``accepted + 1`` tokens (its accepted drafts plus the target's own token).
The break-even floor is :data:`FLOOR` = 4 tokens per round. The governor keeps an exponential
moving average of that yield (:data:`EMA_ALPHA`, starting at 0, so a fresh row begins in *debt*
and must earn its EMA up).

Pausing, checked after every drafted round:

* a row pauses when, after at least :data:`MIN_ROUNDS` drafted rounds, the EMA is below the floor
  **and** the latest round is below the floor too. A latest round at or above the floor therefore
  never pauses the row: good rounds repay the start-up debt instead of being punished for it;
* one round of *grace*: a round that accepted nothing (yield 1), arriving when the EMA was at or
  above the floor and the previous round was not itself low-yield, does not pause the row even if
  it drags the EMA under. Partial low-yield rounds (some drafts accepted, still under the floor) get
  no grace, and grace never covers a second consecutive low-yield round; even then pausing still
  needs the EMA below the floor;
* with ``adaptive = False`` the floor is ignored and the governor never pauses.

While paused the row keeps looking up continuations without proposing them (*shadow* lookups)
and compares each with the token the target actually emitted. :data:`SHADOW_RESUME_TOKENS`
consecutive correct shadow predictions resume verification, with the EMA reset (fresh start-up).

Evidence is only a verified round: a lookup that found nothing (a *plain ask*), a proposal
retracted before any forward (shorter than ``--spec-draft-n-min``), and a row the scheduler gated
out of drafting (no room left for a block) leave the EMA and the round count alone.

The CLI's drafter (``prompt_lookup.PromptLookupDrafter``) has the same two states and the same
shadow mechanism, but no floor: it pauses only on a block with nothing accepted and resumes after
two shadow hits, since a single offline stream has no other rows whose time it could be spending.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel.drafters.lookup.prompt_lookup import BLOCK_START, NgramIndex, PromptLookupCounters, PromptLookupDrafter
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.proposal import Proposal

FLOOR = 4.0
EMA_ALPHA = 0.5
MIN_ROUNDS = 2
SHADOW_RESUME_TOKENS = 7


@dataclass
class LookupGovernor:
    """The pause/resume state machine, fed one event at a time."""

    adaptive: bool = True
    floor: float = FLOOR
    alpha: float = EMA_ALPHA
    min_rounds: int = MIN_ROUNDS
    resume_after: int = SHADOW_RESUME_TOKENS
    paused: bool = False
    ema: float = 0.0
    rounds: int = 0  # drafted rounds since the row started or last resumed
    last_low: bool = False  # the previous drafted round was below the floor
    streak: int = 0  # consecutive correct shadow predictions while paused
    pauses: int = 0
    resumes: int = 0
    graces: int = 0

    def reset(self) -> None:
        self.paused, self.ema, self.rounds, self.last_low, self.streak = False, 0.0, 0, False, 0

    def record_round(self, accepted: int) -> None:
        """A verified round accepted ``accepted`` drafts."""
        if self.paused:
            return  # a paused row proposes nothing, so this cannot be a verified round of it
        y = accepted + 1
        before = self.ema
        self.ema = self.alpha * y + (1.0 - self.alpha) * self.ema
        self.rounds += 1
        low = y < self.floor
        grace = low and accepted == 0 and before >= self.floor and not self.last_low
        if (self.adaptive and low and not grace and self.rounds >= self.min_rounds
                and self.ema < self.floor):
            self.paused = True
            self.pauses += 1
            self.streak = 0
        elif grace:
            self.graces += 1
        self.last_low = low

    def record_shadow(self, hit: bool) -> None:
        """While paused: the shadow lookup did (not) predict the token the target emitted."""
        if not self.paused:
            return
        self.streak = self.streak + 1 if hit else 0
        if self.streak >= self.resume_after:
            self.reset()
            self.resumes += 1


class GovernedPromptLookupDrafter(PromptLookupDrafter):
    """Prompt lookup as the server runs it: the CLI drafter's lookup, with the governor deciding
    when to propose, and ``n_min`` retracting blocks too short to be worth a verify forward.

    Block growth is the CLI drafter's (``prompt_lookup``): replayed on the bench workloads
    (``scripts/trace_prompt_lookup.py``) it never lowered tokens per forward, and doubled it on
    the paragraph rewrite. It changes only how many tokens are proposed, never which tokens are
    emitted, and the governor still sees every verified round as before."""

    kind = "prompt-lookup"

    def __init__(self, ngram_min: int = 1, ngram_max: int = 3, *, n_min: int = 0, adaptive: bool = True,
                 block_start: int | None = None):
        super().__init__(ngram_min, ngram_max,
                         block_start=max(1, n_min, BLOCK_START if block_start is None else block_start))
        self.n_min = max(0, n_min)
        self.governor = LookupGovernor(adaptive=adaptive)
        self.retracted = 0
        self._shadowed = False

    def start(self, sequence: Sequence[int], params: SamplerParams, seed: int) -> None:
        self.index.reset()
        self.governor.reset()
        self.shadow = []
        self._shadowed = False
        self.retracted = 0
        self.block_cap = self.block_start
        self.counters = PromptLookupCounters()

    @property
    def is_paused(self) -> bool:
        return self.governor.paused

    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        found = self.index.continuation(sequence, min(k, self.block_cap))
        if self.governor.paused:
            self.counters.shadow_lookups += 1
            self.shadow = found
            self._shadowed = True
            return Proposal([])
        self.counters.lookups += 1
        if found:
            self.counters.matches += 1
        if found and len(found) < self.n_min:
            self.retracted += 1  # never forwarded: no evidence, not counted
            return Proposal([])
        return Proposal(found)

    def observe(self, sequence: Sequence[int], proposal: Proposal, accepted: int) -> None:
        if proposal.tokens:
            self.counters.verified_blocks += 1
            self.counters.accepted_tokens += accepted
            was_paused = self.governor.paused
            self.governor.record_round(accepted)
            if self.governor.paused and not was_paused:
                self.counters.pauses += 1
            full = accepted == len(proposal.tokens) and not self.governor.paused
            self.block_cap = self.block_cap * 2 if full else self.block_start
            return
        if not self.governor.paused or not self._shadowed:
            return  # a gated-out step made no shadow lookup: no evidence either way
        self._shadowed = False
        emitted = int(sequence[-1])
        hit = bool(self.shadow) and emitted == self.shadow[0]
        if hit:
            self.counters.shadow_hits += 1
        self.shadow = []
        self.governor.record_shadow(hit)
        if not self.governor.paused:
            self.counters.resumes += 1
            self.block_cap = self.block_start


__all__ = ["FLOOR", "BLOCK_START", "EMA_ALPHA", "MIN_ROUNDS", "SHADOW_RESUME_TOKENS", "LookupGovernor",
           "GovernedPromptLookupDrafter", "NgramIndex"]
