"""The environment switches of speculative decoding, as the callers ask for them (each is a field of
``engine/platform/settings.py``, parsed and checked there once; nothing here imports anything heavy,
so a command line can check them before any model code loads):

* ``MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT``: the opt-in to modified rejection sampling;
* ``MLXCEL_SPECULATIVE_ACCEPT_DIAG``: the closed forms of the diagnostic line;
* ``MLXCEL_EXACTNESS_PROBE``: ``auto`` (measure), ``pass`` or ``fail`` (force the verdict).

Each function reads this process's settings, or the ``environ`` mapping a test gives it.
"""

from __future__ import annotations

from collections.abc import Mapping

from mlxcel.engine.platform.settings import settings, value_in, variable

STOCHASTIC_ACCEPT_ENV = variable("speculative_stochastic_accept")
ACCEPT_DIAG_ENV = variable("speculative_accept_diag")
PROBE_ENV = variable("exactness_probe")


def _read(name: str, environ: Mapping[str, str] | None):
    return getattr(settings(), name) if environ is None else value_in(environ, name)


def stochastic_accept_enabled(override: bool | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether modified rejection sampling was asked for: a programmatic ``override`` wins,
    otherwise ``MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT``."""
    if override is not None:
        return bool(override)
    return _read("speculative_stochastic_accept", environ)


def diagnostics_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``MLXCEL_SPECULATIVE_ACCEPT_DIAG=1``: compute the closed forms for the diagnostic line."""
    return _read("speculative_accept_diag", environ)


def probe_mode(environ: Mapping[str, str] | None = None) -> str:
    return _read("exactness_probe", environ)
