"""llama-server's own API: ``/completion`` (and ``/completions``) with its body and stream chunks,
``/infill`` (fill-in-the-middle), ``/tokenize``, ``/detokenize`` and ``/apply-template``."""

from mlxcel.server.http.api.native.routes import add_routes

__all__ = ["add_routes"]
