"""Fault injection for the hardening tests: make the engine thread raise, for real, while it works
on one marked request, so tests can check what the scheduler does with a failure.

``MLXCEL_FAULT_INJECT=STAGE:MARKER[,STAGE:MARKER...]`` (read once, when the scheduler starts;
unset in normal use) arms it. A request whose prompt text contains ``MARKER`` raises
:class:`InjectedFault` at ``STAGE``:

- ``prefill``: while its prompt chunk is forwarded (only that request is in that forward);
- ``sample``: while its row's token is sampled after a batched decode step;
- ``forward``: in the batched decode forward itself, which every decoding row shares.

Nothing else about the request or the engine is changed; the exception travels the same path a
real MLX or sampler error would.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV = "MLXCEL_FAULT_INJECT"
STAGES = ("prefill", "sample", "forward")


class InjectedFault(RuntimeError):
    """The exception an armed fault raises."""


@dataclass(frozen=True)
class FaultPlan:
    faults: tuple[tuple[str, str], ...]  # (stage, marker) pairs

    @classmethod
    def from_env(cls) -> FaultPlan | None:
        spec = os.environ.get(ENV, "")
        if not spec:
            return None
        faults = []
        for entry in spec.split(","):
            stage, sep, marker = entry.partition(":")
            if not sep or stage not in STAGES or not marker:
                raise ValueError(f"{ENV} must be STAGE:MARKER[,STAGE:MARKER...] with STAGE one of "
                                 f"{', '.join(STAGES)}, got {spec!r}")
            faults.append((stage, marker))
        return cls(tuple(faults))

    def stage_for(self, prompt_text: str) -> str | None:
        """The stage at which a request with this prompt fails, or None."""
        return next((stage for stage, marker in self.faults if marker in prompt_text), None)


def fail(stage: str) -> None:
    raise InjectedFault(f"injected fault at the {stage} stage ({ENV})")
