"""Embeddings and reranking: ``/embedding(s)`` and ``/v1/embeddings`` (``--embeddings``),
``/rerank`` and its aliases (``--reranking``): the request bodies read, the inputs tokenized and
the answers shaped (``bodies``), computed on the engine thread between completion steps."""

from mlxcel.server.http.api.embeddings.routes import add_routes

__all__ = ["add_routes"]
