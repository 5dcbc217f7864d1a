"""One sequence's KV cache in a file, with the tokens it holds: MLX's own safetensors I/O
(``mx.save_safetensors`` / ``mx.load``), the per-layer cache state as arrays and what is needed to
rebuild it (mlx-lm's cache class names, their ``meta_state``, the tokens, a model fingerprint) as
the file's string metadata.

Written here rather than with mlx-lm's ``save_prompt_cache`` / ``load_prompt_cache``: those name
and read the file ``*.safetensors`` whatever they are given (MLX picks the format by extension)
while llama-server users choose the name (``slot1.bin``); this one also keeps each layer's
``meta_state`` where the cache class has one, and checks the layout against the model's own.
Only per-position caches are written (``KVCache``, ``RotatingKVCache``, ``QuantizedKVCache``);
recurrent state and nested cache lists are refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import cache as mlx_cache

FORMAT = "mlxcel-slot-1"
WRITABLE = ("KVCache", "RotatingKVCache", "QuantizedKVCache")


class CacheFileError(ValueError):
    """A cache that cannot be written, or a file that is not a cache this model can take."""


def save_cache_file(path: str | Path, cache: list[Any] | None, tokens: list[int], fingerprint: str) -> int:
    """Write ``cache`` (None: an empty one) holding ``tokens`` to ``path``; returns the bytes written.
    The file appears whole or not at all (written beside it, then renamed)."""
    path = Path(path)
    cache = cache or []
    classes = [type(c).__name__ for c in cache]
    bad = sorted({name for name in classes if name not in WRITABLE})
    if bad:
        raise CacheFileError(f"this model's cache ({', '.join(bad)}) cannot be written to a file")
    arrays: dict[str, mx.array] = {}
    scalars: dict[str, object] = {}  # state entries that are not arrays (an offset, a step...)
    for i, layer in enumerate(cache):
        if getattr(layer, "keys", None) is None:  # a layer that has seen no token yet
            continue
        for key, value in tree_flatten(layer.state):
            name = f"{i}.{key}"
            if isinstance(value, mx.array):
                arrays[name] = value
            elif value is None or isinstance(value, (bool, int, float, str)):
                scalars[name] = value
            else:
                raise CacheFileError(f"a {type(layer).__name__} state holds a {type(value).__name__}")
    metadata = {
        "format": FORMAT,
        "classes": json.dumps(classes),
        "meta_state": json.dumps([_meta(c) for c in cache]),
        "filled": json.dumps([getattr(c, "keys", None) is not None for c in cache]),
        "scalars": json.dumps(scalars),
        "tokens": json.dumps([int(t) for t in tokens]),
        "model": fingerprint,
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.safetensors")
    try:
        mx.save_safetensors(str(tmp), arrays, metadata)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path.stat().st_size


def _order(key: str) -> list:
    """Flattened state keys ("0", "1", "10", "2.0") in their numeric order."""
    return [int(p) if p.isdigit() else p for p in key.split(".")]


def _meta(layer: Any) -> list | str:
    meta = getattr(layer, "meta_state", "")  # not every cache class has one
    return list(meta) if isinstance(meta, (tuple, list)) else meta


def load_cache_file(path: str | Path, fingerprint: str, fresh: list[Any]) -> tuple[list[Any], list[int], int]:
    """The cache, its tokens and the file's size in bytes. ``fresh`` is a new cache of the model
    (``make_prompt_cache``): the file's layers must be of its kinds, and its layers that had seen
    no token are taken from it. ``CacheFileError`` for a missing or foreign file, or one written
    for another model (``fingerprint`` differs)."""
    path = Path(path)
    try:
        arrays, metadata = mx.load(str(path), format="safetensors", return_metadata=True)
    except Exception as exc:
        raise CacheFileError(f"cannot read {path.name}: {exc}") from None
    if metadata.get("format") != FORMAT:
        raise CacheFileError(f"{path.name} is not a slot file written by mlxcel-server")
    if metadata.get("model") != fingerprint:
        raise CacheFileError(f"{path.name} was saved from a different model")
    try:
        classes = json.loads(metadata["classes"])
        metas = json.loads(metadata["meta_state"])
        filled = json.loads(metadata["filled"])
        tokens = [int(t) for t in json.loads(metadata["tokens"])]
        scalars = json.loads(metadata["scalars"])
    except (KeyError, ValueError, TypeError) as exc:
        raise CacheFileError(f"{path.name} has malformed metadata: {exc}") from None
    if not classes and not tokens:  # an empty slot was saved
        return list(fresh), [], path.stat().st_size
    if classes != [type(c).__name__ for c in fresh] or not len(metas) == len(filled) == len(classes):
        raise CacheFileError(f"{path.name} holds a cache of another layout than this model's")
    by_layer: dict[int, list[tuple[str, object]]] = {}
    for key, value in [*arrays.items(), *scalars.items()]:
        layer, _, rest = key.partition(".")
        by_layer.setdefault(int(layer), []).append((rest, value))
    cache = []
    for i, (name, meta, full) in enumerate(zip(classes, metas, filled)):
        if name not in WRITABLE:
            raise CacheFileError(f"{path.name} holds an unknown cache kind {name!r}")
        cls = getattr(mlx_cache, name)
        if not full:
            cache.append(fresh[i])
            continue
        layer = cls.from_state(tree_unflatten(sorted(by_layer.get(i, []), key=lambda kv: _order(kv[0]))))
        if meta:
            layer.meta_state = tuple(meta)
        cache.append(layer)
    return cache, tokens, path.stat().st_size
