"""The wheel holds the whole package: every module under engine/, drafters/ and server/, every file
the code reads from its own folders, and no file that is neither (each non-Python file there is
declared package data, or a source of the CPU kernels, which setup.py compiles and MANIFEST.in
puts in the sdist); and the build says nothing it should not (no setuptools warning wall).

What goes into the wheel is read off setuptools itself: ``setup.py build_py`` on a copy of the
project, the step that lays out a wheel's Python files and data. Planted copies (a sub-package
without ``__init__.py``, an undeclared data file, a read of a missing file, package data taken from
MANIFEST.in again) show that each check fails. ``scripts/check_wheel.sh`` builds and installs the
real wheel and sdist (in .ci/run)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest
from runtime_reads import runtime_reads

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("engine", "drafters", "server")
PROJECT_FILES = ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md")
# Compiled into the CPU kernels' module by setup.py and shipped in the sdist by MANIFEST.in: not in the wheel.
KERNEL_SOURCES = "engine/platform/qmatmul_src/"
# build_py says this when the interpreter does not write bytecode (PYTHONDONTWRITEBYTECODE): not about us.
HARMLESS = ("byte-compiling is disabled",)


@dataclass
class Build:
    files: set[str]  # what build_py laid out, as paths in the source tree (mlxcel/engine/x.py -> engine/x.py)
    log: str


def copy_project(dest: Path) -> Path:
    """The files a build reads, without bytecode or compiled modules (build outputs, never sources)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        shutil.copy2(REPO / name, dest / name)
    for root in ROOTS:
        shutil.copytree(REPO / root, dest / root, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
    return dest


def build_py(src: Path, out: Path) -> Build:
    done = subprocess.run([sys.executable, "setup.py", "build_py", "--build-lib", str(out)], cwd=src,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lib = out / "mlxcel"
    return Build({p.relative_to(lib).as_posix() for p in lib.rglob("*") if p.is_file()}, done.stdout + done.stderr)


def tree_files(src: Path) -> list[str]:
    """Every source file under the package folders (no bytecode, compiled modules or editor files)."""
    files = []
    for root in ROOTS:
        for path in sorted((src / root).rglob("*")):
            if (not path.is_file() or "__pycache__" in path.parts or path.name.startswith(".")
                    or path.name.endswith(("~", ".pyc", *EXTENSION_SUFFIXES))):
                continue
            files.append(path.relative_to(src).as_posix())
    return files


def unshipped_modules(src: Path, build: Build) -> list[str]:
    return [f for f in tree_files(src) if f.endswith(".py") and f not in build.files]


def undeclared_data(src: Path, build: Build) -> list[str]:
    return [f for f in tree_files(src)
            if not f.endswith(".py") and not f.startswith(KERNEL_SOURCES) and f not in build.files]


def unshipped_reads(src: Path, build: Build) -> list[str]:
    """Paths the code reads through its own location that the wheel would not hold (a folder: no
    shipped file inside it)."""
    return [f"{path} (read at {where})" for path, where in runtime_reads(src, ROOTS).items()
            if path not in build.files and not any(f.startswith(path + "/") for f in build.files)]


def warnings(build: Build) -> list[str]:
    return [line for line in build.log.splitlines()
            if "warning" in line.lower() and not any(h in line for h in HARMLESS)]


@pytest.fixture(scope="module")
def repo_build(tmp_path_factory) -> tuple[Path, Build]:
    src = copy_project(tmp_path_factory.mktemp("src"))
    return src, build_py(src, tmp_path_factory.mktemp("build"))


def test_every_module_under_the_package_folders_is_in_the_wheel(repo_build):
    src, build = repo_build
    missing = unshipped_modules(src, build)
    assert not missing, "left out of the wheel (in a folder without __init__.py?):\n  " + "\n  ".join(missing)
    assert len([f for f in build.files if f.endswith(".py")]) > 100


def test_every_file_read_at_run_time_is_in_the_wheel(repo_build):
    src, build = repo_build
    undeclared = undeclared_data(src, build)
    assert not undeclared, ("neither package data (pyproject.toml) nor kernel sources:\n  "
                            + "\n  ".join(undeclared))
    unshipped = unshipped_reads(src, build)
    assert not unshipped, "read at run time, not in the wheel:\n  " + "\n  ".join(unshipped)
    # the reads this check exists for are seen (a scanner that found nothing would pass anything)
    assert {"engine/platform/sgemv_shim.c", "server/http/webui/index.html"} <= set(runtime_reads(src, ROOTS))


def test_the_kernel_sources_stay_out_of_the_wheel_and_the_build_is_quiet(repo_build):
    _, build = repo_build
    assert not [f for f in build.files if f.startswith(KERNEL_SOURCES)]
    assert warnings(build) == []


PLANTS = {
    "package folder without __init__.py": ("server/http/plugins/extra.py", "VALUE = 1\n", unshipped_modules,
                                           "server/http/plugins/extra.py"),
    "undeclared data file": ("engine/gguf/tables/names.json", "{}\n", undeclared_data,
                             "engine/gguf/tables/names.json"),
    "read of a file the wheel lacks": ("engine/gguf/table_reader.py",
                                       'from pathlib import Path\n\nTABLE = Path(__file__).with_name("table.txt")\n',
                                       unshipped_reads, "engine/gguf/table.txt"),
}


@pytest.mark.parametrize("plant", PLANTS.values(), ids=list(PLANTS))
def test_each_check_fails_on_a_planted_copy(tmp_path, plant):
    path, text, check, reported = plant
    src = copy_project(tmp_path / "src")
    (src / path).parent.mkdir(parents=True, exist_ok=True)
    (src / path).write_text(text)
    problems = check(src, build_py(src, tmp_path / "build"))
    assert any(p.startswith(reported) for p in problems), problems


def test_package_data_taken_from_the_manifest_again_fails(tmp_path):
    """include-package-data on: MANIFEST.in's kernel sources land in the wheel, with setuptools'
    'Package would be ignored' warnings (the wall `make serve` opened with)."""
    src = copy_project(tmp_path / "src")
    pyproject = src / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("include-package-data = false", "include-package-data = true"))
    build = build_py(src, tmp_path / "build")
    assert [f for f in build.files if f.startswith(KERNEL_SOURCES)]
    assert any("would be ignored" in w.lower() or "absent from the `packages`" in w for w in warnings(build)), build.log
