"""Adding an API is adding a package under ``server/http/api/`` and naming it in ``app.APIS``: a
package that is not named there would never be served, and its routes would silently be missing
(the gcp dispatch, added after the others, is the one package the app calls on its own)."""

from __future__ import annotations

import pkgutil

from fastapi import APIRouter

from mlxcel.server.http import api
from mlxcel.server.http.app import APIS
from mlxcel.server.runtime.config import ServerConfig


def test_every_api_package_is_named_in_the_app():
    packages = {m.name for m in pkgutil.iter_modules(api.__path__) if m.ispkg}
    named = {package.__name__.rpartition(".")[2] for package in APIS}
    assert packages - {"gcp"} == named


def test_every_named_api_adds_its_routes():
    for package in APIS:
        router = APIRouter()
        package.add_routes(router, ServerConfig())
        assert router.routes, package.__name__
