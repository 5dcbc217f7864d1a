"""Upstream's answer on ``/tools`` and ``/cors-proxy`` when the flag that enables them is off: 403
with its own short body (not the usual error object), which the web UI reads as "not available"."""

from __future__ import annotations

from mlxcel.server.http.sse import JsonResponse


async def feature_disabled() -> JsonResponse:
    return JsonResponse({"error": {"message": "this feature is disabled", "type": "feature_disabled"}},
                        status_code=403)
