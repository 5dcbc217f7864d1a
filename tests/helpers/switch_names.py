"""Where the tree names ``MLXCEL_*`` variables: what ``tests/engine/platform/test_settings.py`` holds
against ``engine/platform/settings.py`` and ``docs/settings.md``.

* :func:`stray_reads`: in a Python source, every way it could reach an ``MLXCEL_*`` variable
  itself: a string (or f-string head, or keyword name) that is such a name, ``os.environ`` /
  ``os.getenv`` read with a key that is not a literal (the name could be anything), or ``environ``
  / ``getenv`` imported from ``os``. Product code outside ``settings.py`` must have none.
* :func:`python_names`, :func:`native_names`, :func:`shell_names`: the names a source mentions, as
  strings or keyword names (Python), as ``getenv`` / ``env_int`` arguments (the C++ kernels), as
  words (shell scripts, the Makefile, the Dockerfile).
* :func:`doc_tables`: ``docs/settings.md``'s rows by section, each row's cells.
"""

from __future__ import annotations

import ast
import re

NAME = re.compile(r"MLXCEL_[A-Z0-9_]*")  # the bare prefix too: "MLXCEL_" + name
FULL_NAME = re.compile(r"MLXCEL_[A-Z0-9][A-Z0-9_]*")
NATIVE_READ = re.compile(r"\b(?:getenv|env_int)\(\s*\"(MLXCEL_[A-Z0-9_]+)\"")
WORD = re.compile(r"\bMLXCEL_[A-Z0-9][A-Z0-9_]*\b")


def _is_os_attr(node: ast.AST, attr: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name) \
        and node.value.id == "os"


def _key_read(node: ast.AST) -> ast.AST | None:
    """The key expression of an environment read (``os.environ.get(k)``, ``os.environ[k]``,
    ``os.getenv(k)``, ``k in os.environ``, ``os.environ.pop / setdefault(k)``), else None."""
    if isinstance(node, ast.Call) and node.args:
        f = node.func
        if _is_os_attr(f, "getenv"):
            return node.args[0]
        if isinstance(f, ast.Attribute) and f.attr in ("get", "pop", "setdefault") and _is_os_attr(f.value, "environ"):
            return node.args[0]
    if isinstance(node, ast.Subscript) and _is_os_attr(node.value, "environ"):
        return node.slice
    if isinstance(node, ast.Compare) and any(_is_os_attr(c, "environ") for c in node.comparators):
        return node.left
    return None


def stray_reads(source: str, allowed_keys: frozenset[str] = frozenset()) -> list[str]:
    """``line: what`` for each way ``source`` could read an ``MLXCEL_*`` variable itself.
    ``allowed_keys``: names of variables that may be a read's key (a loop over other programs'
    variable names)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
            found.append(f"{line}: the name {node.value!r}")
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) \
                and str(node.values[0].value).startswith("MLXCEL_"):
            found.append(f"{line}: an f-string naming an MLXCEL_ variable")
        elif isinstance(node, ast.keyword) and node.arg and NAME.fullmatch(node.arg):
            found.append(f"{line}: the keyword {node.arg}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os" \
                and {a.name for a in node.names} & {"environ", "getenv"}:
            found.append(f"{line}: environ / getenv imported from os")
        else:
            key = _key_read(node)
            if key is not None and not (isinstance(key, ast.Constant) and isinstance(key.value, str)) \
                    and not (isinstance(key, ast.Name) and key.id in allowed_keys):
                found.append(f"{line}: an environment read whose key is not a literal")
    return found


def python_names(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and FULL_NAME.fullmatch(node.value):
            names.add(node.value)
        elif isinstance(node, ast.keyword) and node.arg and FULL_NAME.fullmatch(node.arg):
            names.add(node.arg)
    return names


def native_names(source: str) -> set[str]:
    return set(NATIVE_READ.findall(source))


def shell_names(source: str) -> set[str]:
    return set(WORD.findall(source))


def doc_tables(text: str) -> dict[str, dict[str, list[str]]]:
    """Section title -> {variable -> the row's cells after the first} for every table row whose first
    cell is one backticked ``MLXCEL_*`` name."""
    sections: dict[str, dict[str, list[str]]] = {}
    title = ""
    for line in text.splitlines():
        if line.startswith("## "):
            title = line[3:].strip()
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        match = FULL_NAME.fullmatch(cells[0].strip("`")) if cells and cells[0].count("`") == 2 else None
        if match:
            sections.setdefault(title, {})[match.group(0)] = cells[1:]
    return sections
