"""``POST /slots/{id_slot}``: a slot's KV cache saved to, restored from or erased in
``--slot-save-path``."""

from mlxcel.server.http.api.slot_actions.routes import add_routes

__all__ = ["add_routes"]
