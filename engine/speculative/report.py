"""The lines ``mlxcel generate`` prints on stdout after every speculative run: one formatter of a
session's counters (a response's ``timings`` are the other, ``server.runtime.timings``).

``[Speculative acceptance]`` names the rule that actually ran (so an A/B arm can be checked
not to be a silent fallback) and three rates that mean different things:

* ``per_position_acceptance`` = accepted / positions_tested: the per-draft acceptance
  probability theory predicts; compare it across arms and with the closed forms.
* ``acceptance_rate`` = accepted / proposed: the share of drafted tokens that survived. A chain
  stops at its first rejection, so the untested tail of each block drags this down; it moves
  with the block length and is not comparable across arms with different chain profiles.
* ``mean_accepted_len`` = accepted / rounds: drafts gained per target forward.

``[Speculative acceptance diagnostic]`` (``MLXCEL_SPECULATIVE_ACCEPT_DIAG=1``) averages
``sum_x min(p, q)`` and ``sum_x p q`` over the tested positions: what the stochastic rule and
sampler-match should accept at, respectively.
"""

from __future__ import annotations

from mlxcel.engine.speculative.acceptance import RULE_DESCRIPTIONS
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.session import SpeculativeCounters


def acceptance_line(c: SpeculativeCounters) -> str:
    return (
        f"[Speculative acceptance] rule={c.rule} rounds={c.rounds} proposed={c.proposed} "
        f"positions_tested={c.positions_tested} accepted={c.accepted} "
        f"per_position_acceptance={c.per_position_acceptance:.4f} acceptance_rate={c.acceptance_rate:.4f} "
        f"mean_accepted_len={c.mean_accepted_len:.4f} ({RULE_DESCRIPTIONS.get(c.rule, c.rule)})"
    )


def diagnostic_line(c: SpeculativeCounters) -> str:
    if c.positions_tested and not c.diagnosed:
        return ("[Speculative acceptance diagnostic] closed_form_sum_min=n/a closed_form_sum_prod=n/a "
                "(the drafter reports no proposal distribution, so the closed forms are unknown)")
    return (
        f"[Speculative acceptance diagnostic] closed_form_sum_min={c.closed_form_sum_min:.4f} "
        f"closed_form_sum_prod={c.closed_form_sum_prod:.4f} (averages over the {c.diagnosed} tested positions; "
        "per_position_acceptance should sit at sum_prod under sampler-match and at sum_min under the "
        "stochastic rule; sum_min >= sum_prod always)"
    )


def declined_line(reason: str) -> str:
    """What replaces the acceptance line when the session declined the request."""
    return f"[Speculative acceptance] declined: {reason}"


def report_lines(c: SpeculativeCounters, *, diagnostics: bool, drafter: Drafter | None = None,
                 declined: str | None = None) -> list[str]:
    """Everything to print after a run, in order."""
    if declined is not None:
        return [declined_line(declined)]
    lines = [acceptance_line(c)]
    if diagnostics:
        lines.append(diagnostic_line(c))
    extra = drafter.counters_line() if drafter is not None else None
    if extra:
        lines.append(extra)
    return lines
