"""A request's predicted output as a draft source (OpenAI's ``prediction`` field: the file an editor
expects back, sent with the request that edits it).

Not a registry kind: the server builds one :class:`PredictionDrafter` per request that brings a
prediction, alone on a server without a drafter, or ahead of the server's own token-only drafter
(:class:`PredictionFirst`: asked first each round; the server's drafter serves the rounds the
prediction has nothing for).

The drafter walks the output against the prediction (:class:`PredictionAlignment`). While the output
follows the prediction token for token it proposes the prediction's next tokens. Where the output
departs from it (the edit), it proposes nothing until the output's recent tokens are found in the
prediction again: the longest suffix of the output (at least :data:`NGRAM_MIN` tokens, at most
:data:`NGRAM_MAX` compared) that ends in the prediction past the last point the output followed, the
nearest such when several are as long, as prompt lookup finds its matches; or, failing that, the
output's last token alone when it is the very token the output left the prediction at. A
resynchronisation is tentative until the next output token agrees with it, and the search after a
wrong one starts again from the last *confirmed* point, so a spurious match (a common ``"\\n    "`` in
code) never carries the alignment past the place the output will come back to.

Proposals are deterministic (a point mass on each drafted token), so the default rules are exact:
greedy-argmax at temperature 0, sampler-match above it (every emitted token is the draw plain decoding
makes at its position). A wrong prediction costs verify width, never output.

The same walk counts OpenAI's usage: ``accepted_prediction_tokens`` are the prediction tokens the
walk paired with tokens of the completion (each at most once, in order), ``rejected_prediction_tokens``
the rest of the prediction (:func:`prediction_counts`). The count depends on the completion alone, not
on how the rounds went, so a request counts the same whether it speculated or decoded plainly.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.acceptance import one_hot_rows
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.proposal import Proposal

NGRAM_MIN = 2  # output tokens that must agree with the prediction to resynchronise on it
NGRAM_MAX = 32  # the longest suffix compared when ranking resynchronisation points
BLOCK = 32  # a round's most prediction tokens (the session's block; a request's speculative.n_max narrows it)
BLOCK_START = 8  # the first block after the start or a departure; doubles after each fully accepted block
KIND = "prediction"  # what the timings report as draft_kind (joined with the server's own: prediction+...)


class PredictionAlignment:
    """Where an output stands in a prediction, fed the output token by token.

    ``pos``: the prediction index the next output token is expected at (None: the output has departed
    and no resynchronisation point is known). ``anchor``: one past the last prediction token the output
    confirmed by following it. ``matched``: prediction tokens paired with output tokens so far."""

    def __init__(self, prediction: Sequence[int]):
        self.prediction = [int(t) for t in prediction]
        self.output: list[int] = []
        self.pos: int | None = 0
        self.anchor = 0
        self.matched = 0
        self.departed = 0  # output tokens since the last confirmed one (none of them paired)
        self.tentative = 0  # pairs a resynchronisation made, counted once the output confirms it
        self._where: dict[int, list[int]] | None = None  # token -> its prediction indices, built on first need

    def feed(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self._step(int(token))

    def _step(self, token: int) -> None:
        self.output.append(token)
        pos = self.pos
        if pos is not None and pos < len(self.prediction) and self.prediction[pos] == token:
            self.matched += 1 + self.tentative
            self.pos = self.anchor = pos + 1
            self.departed = self.tentative = 0
            return
        self.departed += 1
        self.tentative = 0
        self.pos = self._resync()

    def _resync(self) -> int | None:
        """The prediction index after the best occurrence of the output's suffix ending at or past the
        anchor (module docstring), with its pairs kept tentative; None when there is none."""
        if self._where is None:
            self._where = {}
            for i, t in enumerate(self.prediction):
                self._where.setdefault(t, []).append(i)
        out, pred = self.output, self.prediction
        ends = self._where.get(out[-1], ())
        best_len, best_end = 0, -1
        for j in ends[bisect_left(ends, self.anchor):]:
            n = 1
            while n < NGRAM_MAX and n < len(out) and n <= j and out[-1 - n] == pred[j - n]:
                n += 1
            if n > best_len:
                best_len, best_end = n, j
                if n == NGRAM_MAX:
                    break
        if best_len < NGRAM_MIN:
            if pred[self.anchor:self.anchor + 1] != [out[-1]]:
                return None
            best_len, best_end = 1, self.anchor  # the output came back to the very token it left the prediction at
        # the suffix's tokens that pair: those past the anchor in the prediction, fed since the departure
        self.tentative = min(best_len, best_end + 1 - self.anchor, self.departed)
        return best_end + 1

    def upcoming(self, k: int) -> list[int]:
        """Up to ``k`` prediction tokens the output would take next if it follows the prediction."""
        if self.pos is None or k <= 0:
            return []
        return self.prediction[self.pos:self.pos + k]

    @property
    def accepted(self) -> int:
        """Prediction tokens that appeared in the output (a resynchronisation the output ended on counts)."""
        return self.matched + self.tentative


class PredictionCounts(NamedTuple):
    accepted: int  # prediction tokens that appeared in the completion
    rejected: int  # prediction tokens that did not


def prediction_counts(prediction: Sequence[int], completion: Sequence[int]) -> PredictionCounts:
    """OpenAI's two usage counts for a completion made with ``prediction`` (module docstring)."""
    walk = PredictionAlignment(prediction)
    walk.feed(completion)
    return PredictionCounts(walk.accepted, len(walk.prediction) - walk.accepted)


@dataclass
class PredictionCounters:
    proposals: int = 0  # rounds the prediction drafted
    verified: int = 0  # its drafts the target examined or accepted (every drafted token of those rounds)
    accepted: int = 0


class PredictionDrafter(Drafter):
    """Drafts a request's predicted output (module docstring). ``start`` is handed the sequence as the
    session begins: the prompt and the first token the prefill picked, the first token of the output.
    ``n_min`` (``--spec-draft-n-min`` / ``speculative.n_min``): fewer drafts than that are not proposed."""

    kind = KIND
    deterministic = True
    peeks = True

    def __init__(self, prediction: Sequence[int], *, n_min: int = 0, block_start: int = BLOCK_START):
        self.prediction = [int(t) for t in prediction]
        self.n_min = max(0, n_min)
        self.block_start = max(1, block_start, self.n_min)
        self.block_cap = self.block_start
        self.walk = PredictionAlignment(self.prediction)
        self.seen = 0  # sequence tokens fed to the walk (or skipped as the prompt)
        self.counters = PredictionCounters()

    def start(self, sequence: Sequence[int], params: SamplerParams, seed: int) -> None:
        self.walk = PredictionAlignment(self.prediction)
        self.seen = len(sequence) - 1  # the last token is the output's first
        self.block_cap = self.block_start
        self.counters = PredictionCounters()

    def _catch_up(self, sequence: Sequence[int]) -> None:
        if len(sequence) > self.seen:
            self.walk.feed(sequence[self.seen:])
            self.seen = len(sequence)

    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        self._catch_up(sequence)
        tokens = self.walk.upcoming(min(k, self.block_cap))
        if len(tokens) < max(1, self.n_min):
            return Proposal([])  # nothing, or too short to be worth a verify forward
        self.counters.proposals += 1
        return Proposal(tokens)

    def peek(self, sequence: Sequence[int]) -> int | None:
        self._catch_up(sequence)  # what propose would feed: its later answers are unchanged
        upcoming = self.walk.upcoming(max(1, self.n_min))
        return upcoming[0] if len(upcoming) >= max(1, self.n_min) else None

    def observe(self, sequence: Sequence[int], proposal: Proposal, accepted: int) -> None:
        """Only the block size learns here; the walk reads the emitted tokens at the next proposal."""
        if not proposal.tokens:
            return
        self.counters.verified += len(proposal.tokens)
        self.counters.accepted += accepted
        self.block_cap = self.block_cap * 2 if accepted == len(proposal.tokens) else self.block_start

    def counters_line(self) -> str:
        c = self.counters
        return (f"[Prediction] {len(self.prediction)} tokens, {c.proposals} rounds drafted from it, "
                f"{c.accepted}/{c.verified} drafts accepted, {self.walk.accepted} prediction tokens in the output")


class PredictionFirst(Drafter):
    """The prediction ahead of the server's own token-only drafter: each round the prediction is asked
    first; when it has nothing to offer (the output departed from it and has not come back), the
    server's drafter is. The member that drafted is told how its block fared; the other is told of a
    plain step that brought the sequence where it is: a draft model keeps its cache in step with what it
    is told (unlike ``lookup.combined``'s members, which are all asked and catch up by reading the
    sequence), and the n-gram drafters ignore a round they did not draft.

    Traits are the server drafter's, so the rule is the one its requests get: when that drafter reports
    ``q`` (a draft model) and the stochastic opt-in is on, the prediction's drafts carry their point
    masses as ``q`` (``vocab_size`` wide), which modified rejection sampling takes as it takes any q."""

    kind = KIND

    def __init__(self, prediction: PredictionDrafter, fallback: Drafter, fallback_block: int, vocab_size: int):
        self.prediction = prediction
        self.fallback = fallback
        self.fallback_block = fallback_block
        self.vocab_size = vocab_size
        self.deterministic = fallback.deterministic
        self.provides_distribution = fallback.provides_distribution
        self.argmax_verify = fallback.argmax_verify
        self.peeks = fallback.peeks
        self._served: tuple[Drafter, Proposal] | None = None

    def start(self, sequence: Sequence[int], params: SamplerParams, seed: int) -> None:
        self._served = None
        for member in (self.prediction, self.fallback):
            member.grammar = self.grammar
            member.start(sequence, params, seed)

    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        proposal = self.prediction.propose(sequence, k)
        if proposal.tokens:
            if self.provides_distribution:
                proposal = Proposal(proposal.tokens, one_hot_rows(proposal.tokens, self.vocab_size))
            self._served = (self.prediction, proposal)
            return proposal
        proposal = self.fallback.propose(sequence, min(k, self.fallback_block))
        self._served = (self.fallback, proposal)
        return proposal

    def peek(self, sequence: Sequence[int]) -> int | None:
        token = self.prediction.peek(sequence)
        if token is not None or not self.fallback.peeks:
            return token
        return self.fallback.peek(sequence)

    def observe(self, sequence: Sequence[int], proposal: Proposal, accepted: int) -> None:
        served, self._served = self._served, None
        drafted_by = served[0] if served is not None and served[1] is proposal else None
        for member in (self.prediction, self.fallback):
            if member is drafted_by:
                member.observe(sequence, proposal, accepted)
            else:  # not asked, or asked and outdrafted: a plain step brought the sequence here
                member.observe(sequence, Proposal([]), 0)

    def counters_line(self) -> str | None:
        lines = [line for member in (self.prediction, self.fallback) if (line := member.counters_line())]
        return "\n".join(lines) or None
