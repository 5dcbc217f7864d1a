"""A list of LoRA adapter scales, ``[{"id": 0, "scale": 0.5}, ...]``: a request's ``lora`` field and
``POST /lora-adapters``'s body, read the same way.

As upstream: each entry names an adapter by its id (its place on the command line) and gives its
scale; a later entry for the same id wins; adapters the list leaves out run at 0 (``lora_set``).
Stricter than upstream where upstream quietly drops what it cannot use: an entry that is not an
object with an integer ``id`` and a finite numeric ``scale``, or an id of no loaded adapter, is a 400
(upstream ignores unknown ids, so a typo runs the request without the adapter).
"""

from __future__ import annotations

import math
from typing import Any

from mlxcel.server.runtime.errors import invalid

SHAPE = "Error: 'lora' must be an array of objects with 'id' and 'scale' fields"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_lora_list(value: Any, n_adapters: int, prefix: str = "") -> dict[int, float]:
    """``value`` as scales by adapter id (checked against ``n_adapters`` loaded adapters); errors are
    400s whose message starts with ``prefix`` (a request field's ``"Field 'lora': "``)."""
    if not isinstance(value, list) or not all(isinstance(x, dict) and "id" in x and "scale" in x for x in value):
        raise invalid(prefix + SHAPE)
    scales: dict[int, float] = {}
    for entry in value:
        adapter, scale = entry["id"], entry["scale"]
        if not (isinstance(adapter, int) and not isinstance(adapter, bool)) or not _number(scale):
            raise invalid(prefix + SHAPE)
        try:
            scale = float(scale)
        except OverflowError:  # an integer past float's range
            scale = math.inf
        if not math.isfinite(scale):
            raise invalid(prefix + f"Error: the scale of adapter {adapter} must be a finite number")
        if not 0 <= adapter < n_adapters:
            loaded = f"ids 0 to {n_adapters - 1} are loaded" if n_adapters else "no LoRA adapter is loaded"
            raise invalid(prefix + f"Error: invalid adapter id {adapter} ({loaded})")
        scales[adapter] = scale
    return scales
