"""Liveness and metrics endpoints."""

from __future__ import annotations

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response

from gateway.runtime import Runtime


async def healthz(request: Request) -> Response:
    """Alive and able to serve: the store answers (a Redis outage makes the gateway unready)."""
    runtime: Runtime = request.app.state.runtime
    try:
        store_ok = await runtime.store.ping()
    except Exception:  # any store failure means "not ready", never a 500
        store_ok = False
    status = "ok" if store_ok else "degraded"
    body = orjson.dumps({"status": status, "store": "ok" if store_ok else "unreachable"})
    return Response(body, status_code=200 if store_ok else 503, media_type="application/json")


async def metrics(request: Request) -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
