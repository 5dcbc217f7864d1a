"""`--hf-repo` / `--hf-file` resolve through the Hugging Face cache; offline and uncached is a clear error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

LOAD = (
    "import sys\n"
    "from mlxcel.engine.model.loading import load_model\n"
    "from mlxcel.engine.errors import ModelLoadError\n"
    "try:\n"
    "    m = load_model(hf_repo=sys.argv[1], hf_file=sys.argv[2] or None)\n"
    "    print('loaded', m.source, m.vocab_size)\n"
    "except ModelLoadError as e:\n"
    "    print('error:', e); sys.exit(3)\n"
)


def _fake_cache(root: Path, repo: str, files: dict[str, Path]) -> None:
    """Lay files out the way huggingface_hub's cache stores a downloaded snapshot."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    base = root / ("models--" + repo.replace("/", "--"))
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    snap = base / "snapshots" / commit
    snap.mkdir(parents=True)
    for name, src in files.items():
        shutil.copy(src, snap / name)


def _run(cache: Path, repo: str, filename: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", LOAD, repo, filename], env=env, capture_output=True, text=True,
                          timeout=120)


def test_cached_repo_directory_loads_offline(tiny_llama_dir, tmp_path):
    _fake_cache(tmp_path, "acme/tiny-llama", {p.name: p for p in tiny_llama_dir.iterdir()})
    out = _run(tmp_path, "acme/tiny-llama")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("loaded mlx")


def test_uncached_repo_offline_is_a_clear_error(tmp_path):
    out = _run(tmp_path, "acme/not-downloaded", "model.Q4_K_M.gguf")
    assert out.returncode == 3
    assert "not in the local Hugging Face cache" in out.stdout
    assert "Traceback" not in out.stderr


def test_cached_gguf_file_loads_offline(tiny_llama_dir, tmp_path):
    import tiny_gguf

    gguf = tiny_gguf.write_gguf(tiny_llama_dir, tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"
    _fake_cache(cache, "acme/tiny-llama-GGUF", {"tiny-f32.gguf": gguf})
    out = _run(cache, "acme/tiny-llama-GGUF", "tiny-f32.gguf")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("loaded gguf")
