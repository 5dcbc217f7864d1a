"""The reasoning budget: at most N tokens between the start and the end of thinking, then the
end-of-thinking tag is forced, token by token, whatever the model would have said.

The same state machine as upstream's reasoning-budget sampler: idle until the start tag's tokens
appear (the generation prompt's tokens count, so a prompt that opens the block starts the count),
counting down while thinking (the model's own end tag ends it), and once the budget is spent,
after the current character is complete, forcing ``message + end tag``; a later start tag re-arms
it. :class:`BudgetSpec` is what a request asks for (built by the HTTP layer from the template's
markers); :class:`ReasoningBudget` is one running request's state, advanced with every emitted
token on the engine thread.

Exactness under speculation: a speculating row never lets a verify round run past a point where
forcing may begin (:meth:`ReasoningBudget.round_limit` caps the tokens a round may emit), and a
round that must emit a forced token is a plain step whose sampler can only pick it
(:func:`forcing_params`), so the emitted stream is the one plain decoding emits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mlxcel.engine.sampling.params import SamplerParams

IDLE, COUNTING, WAITING_UTF8, FORCING, DONE = "idle", "counting", "waiting_utf8", "forcing", "done"
UNLIMITED = 2**31 - 1


@dataclass(frozen=True)
class BudgetSpec:
    tokens: int  # the budget (>= 0)
    start: tuple[int, ...]  # the start tag's tokens
    ends: tuple[tuple[int, ...], ...]  # the end tags' tokens (the first is forced)
    forced: tuple[int, ...]  # what is forced once the budget is spent: message + first end tag
    prefill: tuple[int, ...] = ()  # the generation prompt's tokens, seen before the first sampled one


def _ends_with(history: list[int], seq: tuple[int, ...]) -> bool:
    return bool(seq) and len(history) >= len(seq) and tuple(history[-len(seq):]) == seq


class ReasoningBudget:
    """One request's budget state. ``complete(token)`` says whether a token ends on a whole
    UTF-8 character (the state waits for one before forcing, so no character is cut)."""

    def __init__(self, spec: BudgetSpec, complete=lambda token: True):
        self.spec = spec
        self.complete = complete
        self.state = IDLE
        self.remaining = spec.tokens
        self.force_pos = 0
        self._start_window: list[int] = []
        self._end_window: list[int] = []
        for token in spec.prefill:
            self._advance(token, sampled=False)

    @property
    def forced(self) -> int | None:
        """The token the next position must be, or None when the model chooses."""
        if self.state == FORCING and self.force_pos < len(self.spec.forced):
            return self.spec.forced[self.force_pos]
        return None

    def round_limit(self) -> int:
        """The most tokens one verify round may emit without passing a point where forcing may
        begin: the budget left while counting, one token while waiting or forcing, and the whole
        budget plus the token that may complete a start tag while idle or done."""
        if self.state == COUNTING:
            return max(1, self.remaining)
        if self.state in (FORCING, WAITING_UTF8):
            return 1
        return self.spec.tokens + 1

    def accept(self, token: int) -> None:
        """An emitted token."""
        self._advance(token, sampled=True)

    def _arm(self) -> None:
        self.remaining = self.spec.tokens
        self._end_window = []
        self.state = COUNTING
        if self.remaining <= 0:
            self.state, self.force_pos = FORCING, 0

    def _advance(self, token: int, sampled: bool) -> None:
        if self.state in (IDLE, DONE):
            self._start_window = (self._start_window + [token])[-len(self.spec.start):] if self.spec.start else []
            if _ends_with(self._start_window, self.spec.start):
                self._start_window = []
                self._arm()
            return
        if self.state in (COUNTING, WAITING_UTF8):
            longest = max((len(e) for e in self.spec.ends), default=1)
            self._end_window = (self._end_window + [token])[-longest:]
            if any(_ends_with(self._end_window, e) for e in self.spec.ends):
                self.state = DONE
                return
            complete = self.complete(token) if sampled else True
            if self.state == WAITING_UTF8:
                if complete:
                    self.state, self.force_pos = FORCING, 0
            else:
                self.remaining -= 1
                if self.remaining <= 0:
                    self.state = FORCING if complete else WAITING_UTF8
                    self.force_pos = 0
            return
        if self.state == FORCING:
            self.force_pos += 1
            if self.force_pos >= len(self.spec.forced):
                self.state = DONE


def forcing_params(token: int) -> SamplerParams:
    """A sampler that can only pick ``token``: greedy, every other token's logit irrelevant
    against an infinite bias (what upstream does by setting all other logits to -inf)."""
    return dataclasses.replace(SamplerParams(), temperature=0.0, top_k=0, logit_bias={int(token): float("inf")})
