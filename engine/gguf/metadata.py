"""Typed reads of one architecture's ``{arch}.*`` GGUF metadata keys.

llama.cpp reads every hyperparameter with a type, an optional default, and for a few keys a
per-layer array in place of one number (``head_count_kv`` of a hybrid model, say). ``ArchMetadata``
does the same, and a missing required key or an array where one number is meant is a
``ModelLoadError`` naming the key and the file.
"""

from __future__ import annotations

from typing import Any

from mlxcel.engine.errors import ModelLoadError

_REQUIRED = object()


class ArchMetadata:
    """The metadata of one GGUF file, with ``{arch}.`` prefixed to the keys asked for."""

    def __init__(self, metadata: dict[str, Any], arch: str, source: str):
        self.all = metadata
        self.arch = arch
        self.source = source

    def key(self, name: str) -> str:
        return f"{self.arch}.{name}"

    def has(self, name: str) -> bool:
        return self.key(name) in self.all

    def raw(self, name: str, default: Any = None) -> Any:
        return self.all.get(self.key(name), default)

    def _value(self, name: str, default: Any) -> Any:
        value = self.all.get(self.key(name))
        if value is None:
            if default is _REQUIRED:
                raise ModelLoadError(f"{self.source} lacks required metadata {self.key(name)}")
            return default
        return value

    def int(self, name: str, default: Any = _REQUIRED) -> int:
        value = self._value(name, default)
        if value is None:
            return value
        if hasattr(value, "__len__") and not isinstance(value, str):
            values = {int(v) for v in value}
            if len(values) != 1:
                raise ModelLoadError(f"{self.source}: {self.key(name)} varies by layer ({sorted(values)}); "
                                     "this architecture takes one value")
            value = values.pop()
        return int(value)

    def float(self, name: str, default: Any = _REQUIRED) -> float:
        value = self._value(name, default)
        return None if value is None else float(value)

    def bool(self, name: str, default: Any = _REQUIRED) -> bool:
        value = self._value(name, default)
        return None if value is None else bool(value)

    def per_layer(self, name: str, n_layers: int, default: Any = _REQUIRED) -> list:
        """A per-layer list: the stored array, or one stored number repeated."""
        value = self._value(name, default)
        if hasattr(value, "__len__") and not isinstance(value, str):
            values = [v.item() if hasattr(v, "item") else v for v in value]
            if len(values) < n_layers:
                raise ModelLoadError(f"{self.source}: {self.key(name)} has {len(values)} entries "
                                     f"for {n_layers} layers")
            return values[:n_layers]
        return [value] * n_layers
