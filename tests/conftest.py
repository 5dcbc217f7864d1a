"""Shared fixtures: tiny real checkpoints built on disk once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_checkpoints

from mlxcel.engine.platform import settings


def _read_switches_again() -> None:
    """The next ``settings()`` call parses the environment (a bad value raises there, not here)."""
    settings.settings.cache_clear()


class SwitchAwareMonkeyPatch(pytest.MonkeyPatch):
    """pytest's ``monkeypatch``, whose ``setenv`` / ``delenv`` of an ``MLXCEL_*`` variable also make
    this process read its switches again (``engine/platform/settings.py`` reads them once), so a test
    that sets one and then loads a model in-process gets what it set, as do the processes it starts."""

    def setenv(self, name: str, value: str, prepend: str | None = None) -> None:
        super().setenv(name, value, prepend)
        if name.startswith("MLXCEL_"):
            _read_switches_again()

    def delenv(self, name: str, raising: bool = True) -> None:
        super().delenv(name, raising)
        if name.startswith("MLXCEL_"):
            _read_switches_again()


@pytest.fixture
def monkeypatch():
    """pytest's own fixture, switch-aware (above); after the test the switches are read again."""
    patch = SwitchAwareMonkeyPatch()
    yield patch
    patch.undo()
    _read_switches_again()


@pytest.fixture(autouse=True)
def _settings_follow_the_environment():
    """Whatever else a test did to the environment, the next test reads its switches afresh."""
    yield
    _read_switches_again()


@pytest.fixture(scope="session")
def checkpoints_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="session")
def tiny_llama_dir(checkpoints_root) -> Path:
    return tiny_checkpoints.build_hf_checkpoint(checkpoints_root / "tiny-llama", "llama", seed=1)


@pytest.fixture(scope="session")
def tiny_qwen_dir(checkpoints_root) -> Path:
    return tiny_checkpoints.build_hf_checkpoint(checkpoints_root / "tiny-qwen2", "qwen2", seed=2)


@pytest.fixture(scope="session")
def tiny_llama(tiny_llama_dir):
    from mlxcel.engine.model.loading import load_model

    return load_model(tiny_llama_dir)


@pytest.fixture(scope="session")
def tiny_qwen(tiny_qwen_dir):
    from mlxcel.engine.model.loading import load_model

    return load_model(tiny_qwen_dir)


@pytest.fixture(scope="session", params=["llama", "qwen"])
def packed_mixed(request, checkpoints_root):
    """The tiny llama and qwen2 (q/k/v biases) as GGUFs of mixed types (Q8_0 embedding and v, Q4_1
    elsewhere, so a shared q/k/v group mixes types), loaded on the packed CPU kernels."""
    import tiny_gguf
    from gguf import GGMLQuantizationType as Q

    from mlxcel.engine.model.loading import load_model

    src = request.getfixturevalue(f"tiny_{request.param}_dir")
    path = tiny_gguf.write_gguf(src, checkpoints_root / f"mixed-{request.param}.gguf",
                                tiny_gguf.mixed({"token_embd": Q.Q8_0, "attn_v": Q.Q8_0, "": Q.Q4_1}))
    return load_model(path)


@pytest.fixture(scope="session")
def hybrid_dirs(checkpoints_root) -> dict[str, Path]:
    """Tiny targets whose caches hold recurrent state, in their published layouts (tiny_drafters):
    Qwen3.5 and Qwen3-Next (gated-delta layers, with MTP layers), LFM2 (short convolutions)."""
    import tiny_drafters

    return {arch: tiny_drafters.build_target(checkpoints_root / f"hybrid-{arch}", arch, seed=3)
            for arch in ("qwen3_5", "qwen3_next", "lfm2")}


@pytest.fixture(scope="session")
def hybrid(hybrid_dirs):
    from mlxcel.engine.model.loading import load_model

    return {arch: load_model(d) for arch, d in hybrid_dirs.items()}


@pytest.fixture(scope="session")
def vision_files(checkpoints_root) -> dict[str, dict[str, Path]]:
    """Per vision family (``gemma3``, ``qwen2_5_vl``): its tiny checkpoint as mlx-vlm saves one (``dir``),
    and as llama.cpp's converter writes it, the text model (``gguf``) and the projector (``mmproj``).
    Skipped, saying so, without mlx-vlm (the ``vision`` extra)."""
    pytest.importorskip("mlx_vlm", reason="the vision tests need mlx-vlm (pip install 'mlxcel[vision]')")
    import tiny_vision

    out = {}
    for family in ("gemma3", "qwen2_5_vl"):
        root = checkpoints_root / f"vision-{family}"
        vlm = tiny_vision.build_vlm_dir(root / "mlx", family, seed=5)
        out[family] = {"dir": vlm, "gguf": tiny_vision.write_text_gguf(vlm, root / "model.gguf"),
                       "mmproj": tiny_vision.write_mmproj(vlm, root / "mmproj-model.gguf")}
    return out
