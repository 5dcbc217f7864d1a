"""The environment switches of speculative decoding, read and checked in one place (and importing
nothing heavy, so a command line can check them before any model code loads):

* ``MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT``: the opt-in to modified rejection sampling;
* ``MLXCEL_SPECULATIVE_ACCEPT_DIAG``: the closed forms of the diagnostic line;
* ``MLXCEL_EXACTNESS_PROBE``: ``auto`` (measure), ``pass`` or ``fail`` (force the verdict).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from mlxcel.engine.errors import MlxcelError

STOCHASTIC_ACCEPT_ENV = "MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT"
_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"", "0", "false", "no", "off"})
ACCEPT_DIAG_ENV = "MLXCEL_SPECULATIVE_ACCEPT_DIAG"
PROBE_ENV = "MLXCEL_EXACTNESS_PROBE"
PROBE_MODES = ("auto", "pass", "fail")


def parse_switch(name: str, value: str | None) -> bool:
    """An on/off environment value: 1/true/yes/on or 0/false/no/off (any case); unset is off."""
    text = (value or "").strip().lower()
    if text in _ON:
        return True
    if text in _OFF:
        return False
    raise MlxcelError(f"{name}={value!r} is not a switch; use 1/true/yes/on or 0/false/no/off")


def stochastic_accept_enabled(override: bool | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether modified rejection sampling was asked for: a programmatic ``override`` wins,
    otherwise ``MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT``."""
    if override is not None:
        return bool(override)
    env = os.environ if environ is None else environ
    return parse_switch(STOCHASTIC_ACCEPT_ENV, env.get(STOCHASTIC_ACCEPT_ENV))


def diagnostics_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``MLXCEL_SPECULATIVE_ACCEPT_DIAG=1``: compute the closed forms for the diagnostic line."""
    env = os.environ if environ is None else environ
    return parse_switch(ACCEPT_DIAG_ENV, env.get(ACCEPT_DIAG_ENV))


def probe_mode(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    mode = (env.get(PROBE_ENV) or "auto").strip().lower()
    if mode not in PROBE_MODES:
        raise MlxcelError(f"{PROBE_ENV}={mode!r}: choose one of {', '.join(PROBE_MODES)}")
    return mode
