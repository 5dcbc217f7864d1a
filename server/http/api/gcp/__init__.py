"""Google Cloud Vertex AI's prediction route (``AIP_MODE=PREDICTION``): a thin dispatch over every
other API's routes, so the app adds it after all of them (``add_gcp_routes(app, config)``)."""

from mlxcel.server.http.api.gcp.routes import add_gcp_routes

__all__ = ["add_gcp_routes"]
