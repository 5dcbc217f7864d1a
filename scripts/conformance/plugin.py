"""A pytest plugin loaded beside upstream's tests (``-p plugin``): their session fixture starts
every server preset once so that it downloads its hub model (``ServerPreset.load_all``). Nothing
is downloaded here (``launcher.py`` maps every hub model to a local file), so that warm-up is
skipped; each test still starts its own server with the flags it names, for both targets.

Under pytest-xdist (``run.py --workers N``) each worker's servers listen on a port of their own
(upstream's ``PORT`` variable: 8080 + the worker's number), so workers never share a server.

Tests of files ``scope.py`` names out of scope are skipped with its reason, unless
``MLXCEL_CONFORMANCE_ALL=1`` (``run.py --all``; the llama-server baseline always runs them all).

Router mode: upstream's router tests name hub models (``ggml-org/tinygemma3-GGUF:Q8_0``, ...)
that its session warm-up downloads into the model cache, where a router finds them. Here no cache
is filled, so the plugin writes those names into a models preset, each mapped to the local model,
and ``launcher.py`` gives it (``--models-preset``) to a server started with no model and no preset
of its own: the router lists the same names upstream's would, for both targets."""

from __future__ import annotations


def pytest_configure(config) -> None:
    import os

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ... under xdist
    if worker.startswith("gw"):
        os.environ["PORT"] = str(8080 + int(worker[2:]))
    import utils  # upstream's tests/utils.py, importable once pytest has set up its rootdir

    utils.ServerPreset.load_all = staticmethod(lambda: None)
    model = os.environ.get("MLXCEL_CONFORMANCE_MODEL")
    if model:
        os.makedirs(utils.TMP_DIR, exist_ok=True)  # upstream's tests write their presets there
        preset = os.path.join(utils.TMP_DIR, f"router-cache-{worker or 'main'}.ini")
        with open(preset, "w", encoding="utf-8") as f:
            for name in CACHED_HUB_MODELS:
                f.write(f"[{name}]\nmodel = {model}\n\n")
        os.environ["MLXCEL_CONFORMANCE_ROUTER_PRESET"] = preset


# the hub models upstream's session warm-up leaves in the cache that its router tests name
CACHED_HUB_MODELS = ("ggml-org/tinygemma3-GGUF:Q8_0", "ggml-org/test-model-stories260K:F32",
                     "ggml-org/test-model-stories260K-infill:F32")


def pytest_collection_modifyitems(config, items) -> None:
    import os

    import pytest
    from scope import reason

    if os.environ.get("MLXCEL_CONFORMANCE_ALL") == "1":
        return
    for item in items:
        why = reason(item.nodeid)
        if why is not None:
            item.add_marker(pytest.mark.skip(reason=f"out of scope: {why}"))
