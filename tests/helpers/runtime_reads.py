"""The files the package's code finds through its own location, read off the code: ``Path(__file__)``
(and ``os.path.dirname(__file__)``) paths and ``importlib.resources.files("mlxcel....")`` traversables,
built from string constants with ``/``, ``.parent``, ``.parents[n]``, ``.with_name``, ``.joinpath``.

Such a file is read from the installed package, so it must be in the wheel: the packaging test holds
each path found here to what the build puts there. A path built from anything but constants is not
followed (it is not knowable without running the code)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

_IDENTITY_METHODS = {"resolve", "absolute"}


def runtime_reads(root: Path, package_roots: tuple[str, ...]) -> dict[str, str]:
    """``{path: "module.py:line"}`` for every constant path the code under ``package_roots`` builds
    from its own location; ``path`` is relative to ``root`` (absolute when it leaves ``root``)."""
    found: dict[str, str] = {}
    for top in package_roots:
        for module in sorted((root / top).rglob("*.py")):
            if "__pycache__" in module.parts:
                continue
            tree = ast.parse(module.read_text(encoding="utf-8"), filename=str(module))
            for node in ast.walk(tree):
                path = _resolve(node, module, root)
                if path is not None:
                    where = f"{module.relative_to(root).as_posix()}:{node.lineno}"
                    found.setdefault(_relative(path, root), where)
    return found


def _relative(path: Path, root: Path) -> str:
    path = Path(os.path.normpath(path))
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def _string(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _called(node) -> str | None:
    """The name a call's function goes by (``Path``, ``files``, ``with_name``), else None."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _origin(node, module: Path, root: Path) -> Path | None:
    """Where a chain starts: the module's own file, or a package's folder named by ``files()``."""
    name = _called(node)
    if name in ("Path", "PurePath", "dirname") and len(node.args) == 1:
        arg = node.args[0]
        path = module if isinstance(arg, ast.Name) and arg.id == "__file__" else _resolve(arg, module, root)
        return None if path is None else path.parent if name == "dirname" else path
    if name == "files" and len(node.args) == 1:
        arg = node.args[0]
        package = _string(arg)
        if isinstance(arg, ast.Name) and arg.id == "__package__":
            package = "mlxcel." + ".".join(module.parent.relative_to(root).parts)
        if package and package.startswith("mlxcel."):
            return root.joinpath(*package.split(".")[1:])
    return None


def _resolve(node, module: Path, root: Path) -> Path | None:
    """The path ``node`` evaluates to when it is a constant chain from the module's location."""
    start = _origin(node, module, root)
    if start is not None:
        return start
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _string(node.right) is not None:
        base = _resolve(node.left, module, root)
        return None if base is None else base / _string(node.right)
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        base = _resolve(node.value, module, root)
        return None if base is None else base.parent
    if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "parents"
            and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int)):
        base = _resolve(node.value.value, module, root)
        return None if base is None else base.parents[node.slice.value]
    return _resolve_method(node, module, root)


def _resolve_method(node, module: Path, root: Path) -> Path | None:
    """``.with_name("x")``, ``.joinpath("a", "b")``, ``os.path.join(base, "a")``, ``.resolve()``."""
    name = _called(node)
    if name is None:
        return None
    args = [_string(a) for a in node.args]
    if name == "join" and node.args and all(a is not None for a in args[1:]):
        base = _resolve(node.args[0], module, root)
        return None if base is None else base.joinpath(*args[1:])
    if not isinstance(node.func, ast.Attribute) or any(a is None for a in args):
        return None
    if name not in ("with_name", "joinpath", *_IDENTITY_METHODS):
        return None
    base = _resolve(node.func.value, module, root)
    if base is None:
        return None
    if name == "with_name" and len(args) == 1:
        return base.with_name(args[0])
    if name == "joinpath":
        return base.joinpath(*args)
    return base if not args else None
