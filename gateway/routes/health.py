"""Probes and metrics: /healthz (alive), /readyz (ready for traffic), /metrics (Prometheus)."""

from __future__ import annotations

import orjson
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

from gateway import metrics
from gateway.runtime import Runtime

_ALIVE = orjson.dumps({"status": "ok"})


async def healthz(request: Request) -> Response:
    """Alive: the process answers. Never depends on Redis or the upstream, so a liveness probe
    does not restart healthy pods during someone else's outage."""
    return Response(_ALIVE, media_type="application/json")


async def readyz(request: Request) -> Response:
    """Ready for traffic: started (uvicorn accepts nothing before start-up is done), and the store
    answers when requests need it: teams with limits that fail closed (`policy.on_store_failure:
    closed`) are refused 503 without it. Otherwise a store outage only costs what is shared
    (learned windows, calibration, summaries, exact team limits: each replica takes its share
    in memory), and taking every replica out of the Service for it would turn a degraded
    gateway into no gateway: ready, with the store reported. A draining process has closed its
    listener: refused."""
    runtime: Runtime = request.app.state.runtime
    settings = runtime.settings
    if settings.redis_url is None:
        store = "memory"
    else:
        try:
            store = "ok" if await runtime.store.ping() else "unreachable"
        except Exception:  # any store failure is reported, never a 500
            store = "unreachable"
        if store == "unreachable":
            metrics.STORE_ERRORS.labels("ping").inc()
    needed = settings.policy.on_store_failure == "closed" and any(
        limits.requests_per_minute or limits.tokens_per_minute or limits.tokens_per_day
        for limits in (team.limits for team in settings.teams.values())
    )
    ready = store != "unreachable" or not needed
    body = orjson.dumps({"status": "ready" if ready else "not ready", "store": store})
    return Response(body, status_code=200 if ready else 503, media_type="application/json")


async def metrics_endpoint(request: Request) -> Response:
    return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
