"""Which backticked names of a doc no longer exist in the tree.

What a code span is taken to be (the first rule that applies):

1. Not a name, never checked: a span with a space (a command, a snippet, ``POST /v1/...``); a flag
   (``-m``, ``--foo``); an all-capitals word (``MLXCEL_AMX``, ``Q4_K``, ``GET``); an absolute path or
   route (``/completion``, ``/tmp/x``), a home path, a URL, a number; a placeholder (``...``, ``…``,
   ``<build>``); a span holding ``= < > { } [ ] * " ' , ;`` (assignments, globs, JSON) or a ``:``
   that is not part of ``::``.
2. A pytest id, ``tests/x/test_y.py::test_name`` (or ``test_y.py::Class::test``): the file exists and
   defines the last name, at any depth.
3. A C++ name, ``Pool::run``: each part is a word of the native sources (``std::`` is the library's).
4. A path: with a ``/``, one that ends in ``/`` or a source extension, whose first part is a
   folder of the tree, or whose parts are identifiers and the last a dotted one; without one, a file name with a source extension (``ragged.py``). It exists
   from the root, or as the tail of a path of the tree: ``cache/ragged.py`` names
   ``engine/cache/ragged.py``, as the text around it does. Paths into output folders (``.cache/``,
   ``models/``, ``bench-out/``, the ones ``.gitignore`` anchors at the root) are not checked. A last
   part that carries a symbol (``runtime/task.GenerationOptions``,
   ``engine/cache/ragged.RaggedBatch.forward()``) names the module, then the symbol in it (5).
   A data file without a folder (``config.json``, ``model.gguf``) is a checkpoint's or a user's.
5. A dotted name (``verify.verify_round``, ``mlxcel.engine.decode``, ``Scheduler.call()``): the
   longest head that is a module or package of the tree (``mlxcel.`` dropped) must define the next
   part, at its top level or as a member of one of its classes (``session.round()`` names the
   session's method), and when that part is a class, the part after is its member. An import does
   not count: a name re-exported from its old module is stale there, the doc names its new home. With no module
   head, the first part must be a class of the tree that defines the second. A lowercase head that
   is neither is a field (``stream_options.include_usage``, ``general.architecture``), unless the
   span is a call (``foo.bar()``): a call on an unknown head is stale, except an outside library's
   (``EXTERNAL_ROOTS``). ``FIELD_ROOTS`` are the few modules whose names are also JSON objects of the
   API or a checkpoint's tensor prefix (``timings.draft_n``, ``model.norm``).
6. ``name()``: a function or method of that name is defined somewhere in the tree.
7. A CamelCase word (``SpeculativeSession``): a class, function or assignment of that name exists,
   or the code spells it (a word of the native sources, a one-word string of the Python ones, as a
   config's architecture name is), or it is a class of a library mlxcel builds on
   (``EXTERNAL_LIBRARIES``: mlx-lm's ``TokenizerWrapper``, MLX's ``QuantizedLinear``).
8. Anything else (a lowercase word: a field, a variable, a package's name) is not checked.
"""

from __future__ import annotations

import builtins
import importlib.util
import re
from functools import lru_cache
from pathlib import Path

from markdown_spans import code_spans
from tree_names import TreeNames

SOURCE_EXTENSIONS = (".py", ".c", ".cpp", ".h", ".sh", ".md", ".toml", ".html", ".cfg", ".in")
DATA_EXTENSIONS = (".json", ".jsonl", ".gguf", ".safetensors", ".bin", ".so", ".txt", ".log", ".yaml", ".yml")
# modules whose names are also JSON objects of the API or a checkpoint's tensor prefix
FIELD_ROOTS = frozenset({"timings", "speculative", "reasoning", "model", "mtp"})
# heads of calls that belong to other libraries (``mx.eval()``, the OpenAI SDK's ``client.*()``)
EXTERNAL_ROOTS = frozenset({"mx", "mlx", "nn", "np", "gc", "os", "asyncio", "json", "client", "importlib"})
EXTERNAL_LIBRARIES = ("mlx_lm", "mlx", "gguf")
NOT_A_NAME = re.compile(r"[\s=<>{}\[\]*\"',;…]|\.\.\.|://|^[-/~$.]|^\d|(?<!:):(?!:)")
ALL_CAPS = re.compile(r"^[A-Z0-9_]+$")
IDENT = r"[A-Za-z_]\w*"
DOTTED = re.compile(rf"^{IDENT}(\.{IDENT})+(\(\))?$")
CALL = re.compile(rf"^{IDENT}\(\)$")
PATH_AND_SYMBOL = re.compile(rf"^{IDENT}(/{IDENT})*/{IDENT}(\.{IDENT})+(\(\))?$")
CAMEL = re.compile(r"^_?[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*$")


@lru_cache(maxsize=None)
def library_classes(name: str) -> frozenset[str]:
    """Class names defined anywhere in an installed library's Python sources (read, not imported)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    found: set[str] = set()
    for location in spec.submodule_search_locations:
        for path in Path(location).rglob("*.py"):
            found |= set(re.findall(r"^\s*class\s+(\w+)", path.read_text(errors="replace"), re.MULTILINE))
    return frozenset(found)


def modules_at(tree: TreeNames, path: str) -> list:
    """The modules whose file is ``path`` from the root or a tail of it."""
    rel = path.strip("/")
    found = {id(m): m for ms in tree.modules.values() for m in ms if m.path == rel or m.path.endswith("/" + rel)}
    return list(found.values())


def check_symbol(tree: TreeNames, parts: list[str], modules: list) -> str | None:
    """``parts`` inside ``modules``: the first defined there (top level, or a member of one of its
    classes), the second, when the first is a class, a member of it."""
    first = parts[0]
    if not any(first in m.names or any(first in c.members for c in m.classes.values()) for m in modules):
        return f"no definition of {first!r} in {', '.join(sorted(m.path for m in modules))}"
    if len(parts) > 1 and any(first in m.classes for m in modules) and parts[1] not in tree.members(first):
        return f"class {first} defines no {parts[1]!r}"
    return None


def check_dotted(tree: TreeNames, span: str) -> str | None:
    parts = span.removesuffix("()").split(".")
    if parts[0] == "mlxcel" and len(parts) > 1:
        parts = parts[1:]
    for cut in range(len(parts), 0, -1):
        modules = tree.module(tuple(parts[:cut]))
        if not modules:
            continue
        if cut == len(parts) or (cut == 1 and parts[0] in FIELD_ROOTS):
            return None
        return check_symbol(tree, parts[cut:], modules)
    if parts[0] in tree.classes:
        return None if parts[1] in tree.members(parts[0]) else f"class {parts[0]} defines no {parts[1]!r}"
    if parts[0][0].isupper():
        return f"no class {parts[0]!r} in the tree"
    if span.endswith("()") and parts[0] not in EXTERNAL_ROOTS:
        return f"{parts[0]!r} is neither a module nor a class of the tree"
    return None


def check_path(tree: TreeNames, span: str) -> str | None:
    """A path; a last part that carries a symbol (``runtime/task.Task``) names a module and a symbol."""
    head, _, last = span.rstrip("/").rpartition("/")
    if span.endswith("/") or last.endswith(SOURCE_EXTENSIONS + DATA_EXTENSIONS) or "." not in last:
        return None if tree.has_path(span) else "no such file or folder"
    stem, _, symbol = last.partition(".")
    path = f"{head}/{stem}.py" if head else f"{stem}.py"
    modules = modules_at(tree, path)
    if not modules:
        return f"no module {path}"
    return check_symbol(tree, symbol.removesuffix("()").split("."), modules)


def check_pytest_id(tree: TreeNames, span: str) -> str | None:
    path, _, names = span.partition("::")
    wanted = names.split("::")[-1].split("[")[0]
    modules = modules_at(tree, path)
    if not modules:
        return f"no test file {path}"
    return None if any(wanted in m.every_def for m in modules) else f"{path} defines no {wanted!r}"


def check_native(tree: TreeNames, span: str) -> str | None:
    if span.startswith("std::"):
        return None
    missing = [p for p in span.split("::") if p not in tree.native_words]
    return f"not in the native sources: {', '.join(missing)}" if missing else None


def is_path(tree: TreeNames, span: str) -> bool:
    if "/" not in span:
        return span.endswith(SOURCE_EXTENSIONS)
    first = span.split("/")[0]
    if first in tree.ignored:
        return False
    return (span.endswith(("/",) + SOURCE_EXTENSIONS) or first in tree.folder_names
            or bool(PATH_AND_SYMBOL.match(span)))


def camel_exists(tree: TreeNames, name: str) -> bool:
    return (name in tree.every_def or name in tree.top_level or name in tree.string_words
            or name in tree.native_words or any(name in library_classes(lib) for lib in EXTERNAL_LIBRARIES))


def check_span(tree: TreeNames, span: str) -> str | None:
    """Why this code span names nothing in the tree, or None (it does, or it is not a name)."""
    if NOT_A_NAME.search(span) or ALL_CAPS.match(span):
        return None
    if "::" in span:
        return check_pytest_id(tree, span) if ".py::" in span else check_native(tree, span)
    if is_path(tree, span):
        return check_path(tree, span)
    if "/" in span or span.endswith(DATA_EXTENSIONS):
        return None
    if DOTTED.match(span):
        return check_dotted(tree, span)
    if CALL.match(span):
        return None if span[:-2] in tree.every_def else "no function or method of that name"
    if CAMEL.match(span) and not hasattr(builtins, span):
        return None if camel_exists(tree, span) else "no class, function or assignment of that name"
    return None


def stale_names(tree: TreeNames, text: str) -> list[str]:
    """``line N: `span`: why`` for every code span of a Markdown text that names nothing."""
    out = []
    for line, span in code_spans(text):
        why = check_span(tree, span)
        if why:
            out.append(f"line {line}: `{span}`: {why}")
    return out
