"""Build step for mlxcel's one compiled part: the CPU kernels for quantized weights, an MLX
extension (``engine/platform/qmatmul_src``, CMake + nanobind against the installed MLX).

Everything else is declared in pyproject.toml. The kernels are optional: when there is no C++
compiler, CMake, nanobind or MLX CMake package, or the build fails, the install goes on without
them (one warning here) and the CPU runs the float32 path (``engine/platform/qmatmul.py`` says so
in one log line). ``MLXCEL_BUILD_KERNELS=0`` skips the build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCE_DIR = Path(__file__).resolve().parent / "engine" / "platform" / "qmatmul_src"


class CMakeExtension(Extension):
    def __init__(self, name: str, sourcedir: Path):
        super().__init__(name, sources=[])
        self.sourcedir = str(sourcedir)


class OptionalCMakeBuild(build_ext):
    """Configure and build each CMake extension; a failure is a warning, not an error."""

    def run(self):
        self.built = []
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
        mlx_lib = Path(sys.modules["mlx"].__path__[0]) / "lib"
        configure = ["cmake", ext.sourcedir, "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={sys.executable}",
                     f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out.parent}", "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
                     f"-DCMAKE_INSTALL_RPATH={mlx_lib}"]
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

    def copy_extensions_to_source(self):
        # Editable installs copy built modules into the tree; skip the ones that were not built.
        self.extensions = [e for e in self.extensions if not isinstance(e, CMakeExtension) or e.name in self.built]
        super().copy_extensions_to_source()

    def get_outputs(self):
        outs = super().get_outputs()
        return [o for o in outs if Path(o).exists()] if getattr(self, "built", None) is not None else outs


setup(
    ext_modules=[CMakeExtension("mlxcel.engine.platform._qmatmul", SOURCE_DIR)],
    cmdclass={"build_ext": OptionalCMakeBuild},
)
