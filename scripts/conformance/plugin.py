"""A pytest plugin loaded beside upstream's tests (``-p plugin``): their session fixture starts
every server preset once so that it downloads its hub model (``ServerPreset.load_all``). Nothing
is downloaded here (``launcher.py`` maps every hub model to a local file), so that warm-up is
skipped; each test still starts its own server with the flags it names, for both targets."""

from __future__ import annotations


def pytest_configure(config) -> None:
    import utils  # upstream's tests/utils.py, importable once pytest has set up its rootdir

    utils.ServerPreset.load_all = staticmethod(lambda: None)
