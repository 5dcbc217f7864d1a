"""llguidance's grammar compiler run on a thread of its own, with a large stack and a deadline.

Why: llguidance (Rust) compiles a grammar recursively, one native stack frame chain per level of
rule references (a Lark ``a0: a1``, ``a1: a2`` ... chain, a GBNF one, a chain of ``$ref`` in a JSON
schema). On a thread's default stack (8 MiB on Linux, the server's worker threads) a chain of about
a thousand ``$ref`` links overflows it, and a stack overflow is a SIGSEGV that takes the whole server
down, every other request with it. ``grammar_limits`` refuses chains past its limits with a clear
message first; this is the safety net under it: every llguidance call that compiles a grammar
(validating it, building a matcher) runs on a fresh thread whose stack (:data:`STACK_BYTES`, address
space reserved, only the pages used are touched) holds every grammar the limits let through many
times over (the deepest measured cost is about 10 KiB a ``$ref`` link, 3 KiB a Lark rule).

A compile is also given :data:`DEADLINE_S`: the caller gets a :class:`GrammarError` when it runs
longer (llguidance cannot be interrupted: its thread finishes in the background). The size and
shape limits keep every compile far below it; the deadline is the backstop for a shape nobody
thought of, and at most :data:`MAX_RUNNING` compiles run at once, so such shapes cannot pile up
and take every core.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from mlxcel.engine.sampling.grammar_error import GrammarError

log = logging.getLogger(__name__)

T = TypeVar("T")

STACK_BYTES = 256 << 20
DEADLINE_S = 10.0
MAX_RUNNING = 4

_RUNNING = threading.BoundedSemaphore(MAX_RUNNING)
_STARTING = threading.Lock()  # threading.stack_size is process-wide: set, start, restore, one at a time


def on_big_stack(fn: Callable[[], T], what: str = "compiling the grammar") -> T:
    """``fn()`` on a fresh thread with a :data:`STACK_BYTES` stack; its result, or its exception
    re-raised here. A :class:`GrammarError` when it takes longer than :data:`DEADLINE_S` (``what``
    names the work in that message)."""
    deadline = time.monotonic() + DEADLINE_S
    if not _RUNNING.acquire(timeout=DEADLINE_S):
        raise GrammarError(f"{what}: the server is busy with other grammars; try again")
    outcome: dict[str, object] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as it is
            outcome["error"] = exc
        finally:
            _RUNNING.release()
            done.set()

    try:
        _start(run)
    except BaseException:
        _RUNNING.release()
        raise
    if not done.wait(max(0.0, deadline - time.monotonic())):
        log.warning("%s took longer than %g s; its thread finishes in the background", what, DEADLINE_S)
        raise GrammarError(f"{what} took longer than {DEADLINE_S:g} s")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def _start(run: Callable[[], None]) -> None:
    """Start ``run`` on a thread with the big stack; on the default stack where the platform refuses
    that size or cannot map it (the limits still hold there, only without the margin)."""
    with _STARTING:
        try:
            previous = threading.stack_size(STACK_BYTES)
        except (ValueError, RuntimeError):
            log.warning("this platform refuses a %d MiB thread stack; grammars compile on the default one",
                        STACK_BYTES >> 20)
            previous = None
        try:
            threading.Thread(target=run, name="mlxcel-grammar", daemon=True).start()
            return
        except RuntimeError:
            if previous is None:
                raise
        finally:
            if previous is not None:
                threading.stack_size(previous)
    log.warning("a %d MiB thread stack is refused here; this grammar compiles on the default one", STACK_BYTES >> 20)
    threading.Thread(target=run, name="mlxcel-grammar", daemon=True).start()
