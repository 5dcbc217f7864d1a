"""What the repository defines, indexed the way its docs name things: files and folders by their
path, Python modules by any tail of their dotted path (``cache.ragged``, ``ragged``), and each
module's definitions (``def``, ``class``, assignments) and each class's members (methods, class
attributes, the ``self.x`` it assigns, what its bases define), and the one-word strings the code
spells (a config's ``architectures`` entry, a header it reads). C and C++ sources count by the words
they contain, enough to tell that a primitive such as ``QMatmulMulti`` is still there."""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

# where the tree keeps its Python and native sources; build outputs and caches are not names
SOURCE_ROOTS = ("engine", "drafters", "server", "scripts", "tests")
NATIVE_SUFFIXES = (".c", ".cpp", ".h")
WORD = re.compile(r"[A-Za-z_]\w*")


def ignored_dirs(root: Path) -> set[str]:
    """Top-level folders that hold outputs, not sources: hidden ones and those ``.gitignore``
    anchors at the root (``/models/``, ``/bench-out/``...)."""
    names = {p.name for p in root.iterdir() if p.name.startswith(".")}
    gitignore = root / ".gitignore"
    if gitignore.exists():
        for line in gitignore.read_text().splitlines():
            line = line.strip()
            if line.startswith("/") and line.endswith("/"):
                names.add(line.strip("/"))
    return names


@dataclass
class ClassDefs:
    members: set[str] = field(default_factory=set)
    bases: list[str] = field(default_factory=list)


@dataclass
class ModuleDefs:
    path: str
    names: set[str] = field(default_factory=set)
    classes: dict[str, ClassDefs] = field(default_factory=dict)
    every_def: set[str] = field(default_factory=set)
    words: set[str] = field(default_factory=set)


def assigned_names(node: ast.AST) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    out = []
    for t in targets:
        for leaf in ast.walk(t):
            if isinstance(leaf, ast.Name):
                out.append(leaf.id)
    return out


def class_defs(node: ast.ClassDef) -> ClassDefs:
    found = ClassDefs(bases=[b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases])
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.members.add(item.name)
        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
            found.members.update(assigned_names(item))
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) and getattr(sub.value, "id", "") == "self":
            found.members.add(sub.attr)
    return found


def module_defs(path: Path, rel: str) -> ModuleDefs:
    mod = ModuleDefs(rel)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    for item in tree.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            mod.names.add(item.name)
        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
            mod.names.update(assigned_names(item))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            mod.every_def.add(node.name)
        if isinstance(node, ast.ClassDef):
            mod.classes[node.name] = class_defs(node)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and WORD.fullmatch(node.value):
            mod.words.add(node.value)  # a name the code spells as text: a config's architecture, a header
    return mod


@dataclass(repr=False)
class TreeNames:
    root: Path
    paths: set[str] = field(default_factory=set)
    modules: dict[tuple[str, ...], list[ModuleDefs]] = field(default_factory=dict)
    classes: dict[str, list[ClassDefs]] = field(default_factory=dict)
    every_def: set[str] = field(default_factory=set)
    top_level: set[str] = field(default_factory=set)
    string_words: set[str] = field(default_factory=set)
    native_words: set[str] = field(default_factory=set)
    folder_names: set[str] = field(default_factory=set)
    ignored: set[str] = field(default_factory=set)

    def module(self, parts: tuple[str, ...]) -> list[ModuleDefs]:
        """The modules (or packages) whose dotted path ends with ``parts``."""
        return self.modules.get(parts, [])

    def members(self, cls: str, seen: frozenset[str] = frozenset()) -> set[str]:
        """What a class of that name defines, its bases' members included (every class of the name)."""
        out: set[str] = set()
        for c in self.classes.get(cls, []):
            out |= c.members
            for base in c.bases:
                if base and base not in seen:
                    out |= self.members(base, seen | {cls})
        return out

    def has_path(self, rel: str) -> bool:
        """A file or folder at that path from the root, or (for a relative name such as
        ``cache/ragged.py``) at that tail of a path of the tree."""
        rel = rel.strip("/")
        return rel in self.paths or any(p.endswith("/" + rel) for p in self.paths)

    def add_module(self, rel: str, mod: ModuleDefs) -> None:
        parts = tuple(rel[: -len(".py")].split("/"))
        if parts[-1] == "__init__":
            parts = parts[:-1]
        for i in range(len(parts)):
            self.modules.setdefault(parts[i:], []).append(mod)
        for name, c in mod.classes.items():
            self.classes.setdefault(name, []).append(c)
        self.every_def |= mod.every_def
        self.top_level |= mod.names
        self.string_words |= mod.words


def walk(root: Path):
    skip = ignored_dirs(root)
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(d for d in dirnames if not (rel_dir == "." and d in skip)
                             and d != "__pycache__" and not d.startswith(".") and not d.endswith(".egg-info"))
        for d in dirnames:
            yield os.path.normpath(os.path.join(rel_dir, d)), False
        for f in filenames:
            yield os.path.normpath(os.path.join(rel_dir, f)), True


def index_tree(root: Path) -> TreeNames:
    tree = TreeNames(root, ignored=ignored_dirs(root))
    for rel, is_file in walk(root):
        tree.paths.add(rel)
        if not is_file:
            tree.folder_names.add(rel.rsplit("/", 1)[-1])
        if not is_file or rel.split("/")[0] not in SOURCE_ROOTS:
            continue
        if rel.endswith(".py"):
            tree.add_module(rel, module_defs(root / rel, rel))
        elif rel.endswith(NATIVE_SUFFIXES):
            tree.native_words |= set(WORD.findall((root / rel).read_text(encoding="utf-8", errors="replace")))
    return tree
