"""Upstream's routes for features this server does not have, each a 501 that says what is
missing, as upstream answers with the feature switched off."""

from mlxcel.server.http.api.unsupported.routes import add_routes

__all__ = ["add_routes"]
