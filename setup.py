"""Build step for mlxcel's one compiled part: the CPU kernels for quantized weights, an MLX
extension (``engine/platform/qmatmul_src``, CMake + nanobind against the installed MLX).

Also the package list: the top-level folders ``engine/``, ``drafters/`` and ``server/`` install as
``mlxcel.engine``, ``mlxcel.drafters`` and ``mlxcel.server``, and every package below them is found on
disk (``mlxcel_packages``), so a new sub-package cannot be left out of the wheel. Everything else,
package data included, is declared in pyproject.toml.

The kernels are optional: when there is no C++ compiler, CMake, nanobind or MLX CMake package, or
the build fails, the install goes on without them (one warning here) and the CPU runs the float32
path (``engine/platform/qmatmul.py`` says so in one log line). ``MLXCEL_BUILD_KERNELS=0`` skips the
build. Their sources reach the sdist through MANIFEST.in and are compiled into the module, so the
wheel carries the module and not the sources.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
# The design card fixes the top-level folders; each installs as a subpackage of `mlxcel`.
PACKAGE_ROOTS = ("engine", "drafters", "server")
SOURCE_DIR = HERE / "engine" / "platform" / "qmatmul_src"


def mlxcel_packages() -> list[str]:
    """Every package (a folder with ``__init__.py``) under the top-level folders, by its installed
    name: ``server/http/routes`` is ``mlxcel.server.http.routes``."""
    include = [name for root in PACKAGE_ROOTS for name in (root, f"{root}.*")]
    return sorted(f"mlxcel.{name}" for name in find_packages(where=str(HERE), include=include))


class CMakeExtension(Extension):
    def __init__(self, name: str, sourcedir: Path):
        super().__init__(name, sources=[])
        self.sourcedir = str(sourcedir)


class OptionalCMakeBuild(build_ext):
    """Configure and build each CMake extension; a failure is a warning, not an error."""

    def run(self):
        self.built = []
        # read before setuptools' run() clears `inplace` for the build proper
        self.in_tree = bool(self.inplace or getattr(self, "editable_mode", False))
        super().run()

    def build_extension(self, ext):
        if not isinstance(ext, CMakeExtension):
            return super().build_extension(ext)
        out = Path(self.get_ext_fullpath(ext.name)).resolve()
        why = self._build(ext, out)
        if why:
            sys.stderr.write(f"mlxcel: CPU kernels not built ({why}); on a CPU quantized models run as float32\n")
        else:
            self.built.append(ext.name)

    def _build(self, ext, out: Path) -> str | None:
        if os.environ.get("MLXCEL_BUILD_KERNELS", "1").lower() in ("0", "false", "no", "off"):
            return "MLXCEL_BUILD_KERNELS=0"
        if shutil.which("cmake") is None:
            return "no cmake"
        if shutil.which(os.environ.get("CXX", "c++")) is None and shutil.which("g++") is None:
            return "no C++ compiler"
        try:
            import mlx  # noqa: F401, PLC0415 - defers mlx: its absence is a reason to skip, not an error
            import nanobind  # noqa: F401, PLC0415 - defers nanobind likewise
        except ImportError as exc:
            return f"{exc.name} is not importable at build time"
        tmp = Path(self.build_temp).resolve() / ext.name
        tmp.mkdir(parents=True, exist_ok=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        configure = ["cmake", ext.sourcedir, "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={sys.executable}",
                     f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out.parent}", "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
                     f"-DCMAKE_INSTALL_RPATH={';'.join(self._mlx_rpath(ext))}"]
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        try:
            for cmd in (configure, ["cmake", "--build", ".", "-j", jobs]):
                done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
                if done.returncode != 0:
                    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                    return f"{cmd[0]} {cmd[1]} failed: {' | '.join(tail)}"
        except OSError as exc:
            return str(exc)
        return None if out.exists() else f"{out.name} was not produced"

    def _mlx_rpath(self, ext) -> list[str]:
        """Where the module finds ``libmlx.so``: the ``mlx`` package beside the installed ``mlxcel``
        (a relative path, since an isolated build's own MLX is deleted after the build); an in-place
        (editable) build also names the MLX it was built against, as its module stays in the tree."""
        depth = ext.name.count(".")  # mlxcel.engine.platform._qmatmul: three folders up to site-packages
        paths = ["$ORIGIN/" + "../" * depth + "mlx/lib"]
        if self.in_tree:
            paths.append(str(Path(sys.modules["mlx"].__path__[0]) / "lib"))
        return paths

    def copy_extensions_to_source(self):
        # Editable installs copy built modules into the tree; skip the ones that were not built.
        self.extensions = [e for e in self.extensions if not isinstance(e, CMakeExtension) or e.name in self.built]
        # The copy would rewrite the old module in place, under the servers and tests that have it
        # mapped (a truncated mapping is a SIGBUS): unlinked first, they keep the old file, new ones load the new.
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            package, _, _ = self.get_ext_fullname(ext.name).rpartition(".")
            target = Path(build_py.get_package_dir(package)) / Path(self.get_ext_filename(ext.name)).name
            target.unlink(missing_ok=True)
        super().copy_extensions_to_source()

    def get_outputs(self):
        outs = super().get_outputs()
        return [o for o in outs if Path(o).exists()] if getattr(self, "built", None) is not None else outs


setup(
    packages=mlxcel_packages(),
    package_dir={f"mlxcel.{root}": root for root in PACKAGE_ROOTS},
    ext_modules=[CMakeExtension("mlxcel.engine.platform._qmatmul", SOURCE_DIR)],
    cmdclass={"build_ext": OptionalCMakeBuild},
)
