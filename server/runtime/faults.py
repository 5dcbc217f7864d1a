"""Fault injection for the hardening tests: make the engine thread raise, for real, while it works
on one marked request, so tests can check what the scheduler does with a failure.

``MLXCEL_FAULT_INJECT=STAGE:MARKER[,STAGE:MARKER...]`` (checked with the other switches at start,
``engine/platform/settings.py``; unset in normal use) arms it. A request whose prompt text contains ``MARKER`` raises
:class:`InjectedFault` at ``STAGE``:

- ``prefill``: while its prompt chunk is forwarded (only that request is in that forward);
- ``sample``: while its row's token is sampled after a batched decode step;
- ``forward``: in the batched decode forward itself, which every decoding row shares.

Nothing else about the request or the engine is changed; the exception travels the same path a
real MLX or sampler error would.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxcel.engine.platform.settings import FAULT_STAGES, settings, variable

ENV = variable("fault_inject")
STAGES = FAULT_STAGES


class InjectedFault(RuntimeError):
    """The exception an armed fault raises."""


@dataclass(frozen=True)
class FaultPlan:
    faults: tuple[tuple[str, str], ...]  # (stage, marker) pairs

    @classmethod
    def from_env(cls) -> FaultPlan | None:
        faults = settings().fault_inject
        return cls(faults) if faults else None

    def stage_for(self, prompt_text: str) -> str | None:
        """The stage at which a request with this prompt fails, or None."""
        return next((stage for stage, marker in self.faults if marker in prompt_text), None)


def fail(stage: str) -> None:
    raise InjectedFault(f"injected fault at the {stage} stage ({ENV})")
