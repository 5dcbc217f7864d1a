"""Every ``MLXCEL_*`` environment switch mlxcel's Python code reads, in one typed object read once.

The switches used to be read where they were used (the same variable in a dozen places, each with
its own idea of what "off" spells), so nobody could list them without grep and a typo was silently
the default. Now each is one field of :class:`Settings`: its variable, type, default, one-line
meaning and kind live in the field's metadata, every value is parsed and checked together when
:func:`settings` is first called (a bad value is one :class:`SettingsError` naming the variable),
and the same frozen object is returned after that. ``docs/settings.md`` is the table for people;
``tests/engine/platform/test_settings.py`` keeps it equal to this one, and fails when code outside
this module reads an ``MLXCEL_*`` variable itself.

Kinds: ``user`` (a setting someone running mlxcel may want), ``benchmark arm`` (the other side of a
default path, for the A/B scripts under ``scripts/``), ``test hook`` (for tests and measurements),
``internal`` (written by mlxcel itself for a process it starts).

A value that is empty counts as unset. On/off switches take ``1/true/yes/on`` or ``0/false/no/off``
in any case.

Light on purpose (no MLX): the entry points check the switches before MLX loads
(``server/cli/main.py``), and ``scripts/with-blas`` runs ``openblas_core`` before the process that
loads OpenBLAS. A process that changes a switch for itself and for the processes it starts calls
:func:`set_switches` (it writes the variables, then re-reads), or :func:`switched` for one block;
tests that change the environment themselves call :func:`reload`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from mlxcel.engine.errors import MlxcelError

USER, ARM, TEST, INTERNAL = "user", "benchmark arm", "test hook", "internal"
KINDS = (USER, ARM, TEST, INTERNAL)
LOG_LEVELS = ("debug", "info", "warning", "error")
PROBE_MODES = ("auto", "pass", "fail")
FAULT_STAGES = ("prefill", "sample", "forward")
_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"0", "false", "no", "off"})


class SettingsError(MlxcelError):
    """An ``MLXCEL_*`` variable holds a value its switch does not take."""


# -- parsers: the variable's text (stripped, never empty) -> the field's value, or ValueError(why) --

def on_off(text: str) -> bool:
    word = text.lower()
    if word in _ON:
        return True
    if word in _OFF:
        return False
    raise ValueError("not a switch; use 1/true/yes/on or 0/false/no/off")


def _marked(text: str) -> bool:
    return True  # any value marks it (a preload mark: scripts/with-blas writes 1)


def _one_of(*names: str, aliases: Mapping[str, str] | None = None) -> Callable[[str], str]:
    table = {**{n: n for n in names}, **(aliases or {})}

    def parse(text: str) -> str:
        word = text.lower()
        if word not in table:
            raise ValueError(f"choose one of {', '.join(table)}")
        return table[word]
    return parse


def _integer(floor: int) -> Callable[[str], int]:
    """An integer; below ``floor`` it is taken as ``floor`` (as the readers always did)."""
    def parse(text: str) -> int:
        try:
            return max(floor, int(text))
        except ValueError:
            raise ValueError("expected a whole number") from None
    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("expected a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError("expected a number of seconds above 0")
    return value


def _mebibytes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("expected a number of MiB") from None
    if not math.isfinite(value):
        raise ValueError("expected a finite number of MiB")
    return max(0.0, value)


def _text(text: str) -> str:
    return text


def _coretype(text: str) -> str:
    if text.lower() == "keep":
        return "keep"
    if not re.fullmatch(r"[A-Za-z0-9_]+", text):
        raise ValueError("expected keep or an OpenBLAS core name (SkylakeX, Haswell, Zen, ...)")
    return text


def _verify_cost(text: str) -> str | tuple[float, float]:
    word = text.lower()
    if word in ("off", "0", "none", "no"):
        return "off"
    if word in ("measured", "learn"):
        return word
    try:
        fixed, per_token = (float(x) for x in word.split(","))
    except ValueError:
        raise ValueError("expected FIXED_MS,PER_TOKEN_MS (e.g. 25,6.4), measured, learn or off") from None
    if not (math.isfinite(fixed) and math.isfinite(per_token)) or fixed < 0 or per_token < 0:
        raise ValueError("both costs must be finite and >= 0")
    return fixed, per_token


def _faults(text: str) -> tuple[tuple[str, str], ...]:
    faults = []
    for entry in text.split(","):
        stage, sep, marker = entry.partition(":")
        if not sep or stage not in FAULT_STAGES or not marker:
            raise ValueError(f"expected STAGE:MARKER[,STAGE:MARKER...] with STAGE one of {', '.join(FAULT_STAGES)}")
        faults.append((stage, marker))
    return tuple(faults)


def _switch(var: str, default: Any, kind: str, meaning: str, parse: Callable[[str], Any]) -> Any:
    return dataclasses.field(default=default, metadata={"var": var, "kind": kind, "meaning": meaning, "parse": parse})


@dataclass(frozen=True)
class Settings:
    """One field per switch; ``docs/settings.md`` says more about each."""

    # what runs where (engine/platform/device.py, qmatmul.py)
    kernels: Literal["auto", "mlx"] = _switch(
        "MLXCEL_KERNELS", "auto", USER, "`mlx`: the MLX-native profile, what Metal and CUDA run (MLX's quantized "
        "modules, half precision, mlx-lm's caches and kernels; no CPU kernels, no one-row matmul shim), here on "
        "the CPU; `auto`: that profile on a GPU, mlxcel's CPU kernels on a CPU", _one_of("auto", "mlx"))
    batch_invariant: Literal["auto", "on", "off"] = _switch(
        "MLXCEL_BATCH_INVARIANT", "auto", USER, "`auto`: every row forwards alone where the start-up probe finds a "
        "row's logits depend on the rows beside it (so a request's tokens never depend on its neighbours); `on`: "
        "always; `off`: never (throughput over that guarantee)", _one_of("auto", "on", "off"))
    weights: Literal["quantized", "float32"] | None = _switch(
        "MLXCEL_WEIGHTS", None, USER, "quantized checkpoints: `quantized` (`q`, `keep`) keeps MLX's own quantized "
        "modules, `float32` (`f32`, `dequantize`) dequantizes them; unset: the CPU kernels on a CPU, MLX's on a GPU",
        _one_of("quantized", "float32", aliases={"q": "quantized", "keep": "quantized", "f32": "float32",
                                                   "dequantize": "float32"}))
    dtype: Literal["float32", "float16", "bfloat16"] | None = _switch(
        "MLXCEL_DTYPE", None, USER, "the dtype float weights are cast to at load (`float32`, `float16`, `bfloat16`); "
        "unset: float32 on a CPU, float16 on a GPU",
        _one_of("float32", "float16", "bfloat16", aliases={"f32": "float32", "f16": "float16", "bf16": "bfloat16"}))
    cpu_kernels: bool = _switch(
        "MLXCEL_CPU_KERNELS", True, USER, "off: do not load mlxcel's CPU kernels (everything runs in float32 on "
        "MLX's matmul with OpenBLAS, as where no compiler was found at install)", on_off)
    float_kernel: bool = _switch(
        "MLXCEL_FLOAT_KERNEL", True, ARM, "off: float weights stay on MLX's matmul (OpenBLAS) instead of the CPU "
        "kernels' float32 tiles", on_off)
    fused_ops: bool = _switch(
        "MLXCEL_FUSED_OPS", True, TEST, "off: a packed model keeps MLX's norm, rope and attention (and its blocks "
        "mlx-lm's forward) instead of the extension's single primitives", on_off)
    fused_layer: bool = _switch(
        "MLXCEL_FUSED_LAYER", True, ARM, "off: the ragged forward runs a llama-style layer as its separate "
        "primitives instead of the two layer primitives", on_off)
    # BLAS (device.py, blas_shim.py, openblas_core.py)
    blas_preload: bool = _switch(
        "MLXCEL_BLAS_PRELOAD", True, USER, "off: do not re-execute with OpenBLAS and the one-row matmul shim "
        "preloaded (MLX's bundled reference BLAS)", on_off)
    blas_preloaded: bool = _switch(
        "MLXCEL_BLAS_PRELOADED", False, INTERNAL, "set by `scripts/with-blas` and by mlxcel for the processes it "
        "starts: OpenBLAS is already preloaded, do not re-execute", _marked)
    openblas_coretype: str | None = _switch(
        "MLXCEL_OPENBLAS_CORETYPE", None, USER, "the `OPENBLAS_CORETYPE` processes start with: an OpenBLAS core "
        "name, or `keep` for the inherited one; unset: `SkylakeX` on an AVX-512 CPU, else OpenBLAS's choice",
        _coretype)
    cache_dir: str | None = _switch(
        "MLXCEL_CACHE_DIR", None, USER, "where the one-row matmul shim is built; unset: "
        "`$XDG_CACHE_HOME/mlxcel` (`~/.cache/mlxcel`)", _text)
    grammar_threads: int | None = _switch(
        "MLXCEL_GRAMMAR_THREADS", None, USER, "threads computing a step's grammar masks; unset: 1 on a CPU, every "
        "core but one on a GPU", _integer(1))
    log: Literal["debug", "info", "warning", "error"] | None = _switch(
        "MLXCEL_LOG", None, USER, "a stderr log handler at this level (`debug`, `info`, `warning`, `error`); "
        "unset: none", _one_of(*LOG_LEVELS, aliases={"warn": "warning"}))
    load_progress_min_mb: float = _switch(
        "MLXCEL_LOAD_PROGRESS_MIN_MB", 1024.0, USER, "GGUF files of at least this many MiB log their load's "
        "progress (0: every file)", _mebibytes)
    # the server (server/http/limits.py, server/cli/connection_guard.py, server/runtime/)
    max_queue: int | None = _switch(
        "MLXCEL_MAX_QUEUE", None, USER, "requests that may wait for a slot when `--max-queue` is not given; "
        "unset: 256", _integer(1))
    max_connections_per_ip: int | None = _switch(
        "MLXCEL_MAX_CONNECTIONS_PER_IP", None, USER, "connections one address may hold at once, 0 for no limit; "
        "unset: 64", _integer(0))
    lockstep_stall_s: float = _switch(
        "MLXCEL_LOCKSTEP_STALL_S", 120.0, USER, "seconds without an engine step after which a distributed "
        "server takes a rank as lost", _seconds)
    trace_steps: str | None = _switch(
        "MLXCEL_TRACE_STEPS", None, USER, "a file the scheduler appends one JSON line a step to "
        "(`scripts/trace_steps.py` reads it); unset: no trace", _text)
    unified_step: bool = _switch(
        "MLXCEL_UNIFIED_STEP", True, ARM, "off: rows that need not share the ragged forward keep to the batch "
        "cache (each prompt prefilled in its own forward)", on_off)
    run_ahead: bool = _switch(
        "MLXCEL_RUN_AHEAD", True, ARM, "off: no pipelined decode steps (each step's tokens read before the next "
        "forward is queued)", on_off)
    fault_inject: tuple[tuple[str, str], ...] = _switch(
        "MLXCEL_FAULT_INJECT", (), TEST, "`STAGE:MARKER[,...]`: the engine raises at STAGE (prefill, sample, "
        "forward) for a request whose prompt holds MARKER", _faults)
    # speculative decoding (engine/speculative/)
    verify_cost: Literal["off", "measured", "learn"] | tuple[float, float] | None = _switch(
        "MLXCEL_VERIFY_COST", None, ARM, "the verify cost model: `FIXED_MS,PER_TOKEN_MS` (pinned), `measured`, "
        "`learn` (measured, then learned while serving) or `off` (no per-row draft cap); unset: measured",
        _verify_cost)
    exactness_probe: Literal["auto", "pass", "fail"] = _switch(
        "MLXCEL_EXACTNESS_PROBE", "auto", TEST, "a model-based drafter's block verify: `auto` (measured at load), "
        "`pass` or `fail` (forced)", _one_of(*PROBE_MODES))
    speculative_stochastic_accept: bool = _switch(
        "MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT", False, USER, "on: modified rejection sampling where the drafter "
        "gives its distribution", on_off)
    speculative_accept_diag: bool = _switch(
        "MLXCEL_SPECULATIVE_ACCEPT_DIAG", False, USER, "on: the acceptance report's closed forms "
        "(`[Speculative acceptance diagnostic]`)", on_off)


SWITCHES: tuple[dataclasses.Field, ...] = dataclasses.fields(Settings)
_BY_NAME = {f.name: f for f in SWITCHES}


def variable(name: str) -> str:
    """The environment variable of the field ``name`` (``variable("weights") == "MLXCEL_WEIGHTS"``)."""
    return _BY_NAME[name].metadata["var"]


def value_in(environ: Mapping[str, str], name: str) -> Any:
    """The field ``name`` as ``environ`` sets it (the environment a child process is given)."""
    f = _BY_NAME[name]
    raw = environ.get(f.metadata["var"])
    if raw is None or not raw.strip():
        return f.default
    try:
        return f.metadata["parse"](raw.strip())
    except ValueError as exc:
        raise SettingsError(f"{f.metadata['var']}={raw!r}: {exc}") from None


def from_environ(environ: Mapping[str, str]) -> Settings:
    """Every switch as ``environ`` sets it, checked; the first bad value raises."""
    return Settings(**{f.name: value_in(environ, f.name) for f in SWITCHES})


@functools.cache
def settings() -> Settings:
    """This process's switches, parsed on the first call and the same object after it."""
    return from_environ(os.environ)


def reload() -> Settings:
    """Read the environment again (after a test changed it)."""
    settings.cache_clear()
    return settings()


def set_switches(**values: Any) -> Settings:
    """Set switches, by field name, for this process and every process it starts from now on (they
    inherit the variables), then read them again; a bad value raises and changes nothing."""
    text = {variable(name): str(value) for name, value in values.items()}
    for name in values:
        value_in(text, name)
    os.environ.update(text)
    return reload()


@contextlib.contextmanager
def switched(**values: Any) -> Iterator[Settings]:
    """:func:`set_switches` for the block only: after it the variables are as they were, and read again."""
    before = {variable(name): os.environ.get(variable(name)) for name in values}
    try:
        yield set_switches(**values)
    finally:
        for var, old in before.items():
            if old is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = old
        reload()
