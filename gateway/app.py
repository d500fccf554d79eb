"""Builds the Starlette application: routes, lifespan, error handling."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway import metrics
from gateway.errors import GatewayError, anthropic_path
from gateway.middleware import RequestGuard
from gateway.request_log import RequestLines
from gateway.request_path import PathGuard
from gateway.routes.chat import chat_completions
from gateway.routes.health import healthz, metrics_endpoint, readyz
from gateway.routes.messages import anthropic_passthrough, messages
from gateway.routes.passthrough import passthrough
from gateway.routes.responses import responses
from gateway.runtime import Runtime
from gateway.server.heap import settle_heap
from gateway.settings import Settings
from gateway.tokens.encodings import warm_up

ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


def create_app(settings: Settings) -> Starlette:
    runtime = Runtime.create(settings)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The first encoding load costs ~0.4 s and the model map ~0.05 s: pay them before the
        # first request, not during it.
        warm_up()
        runtime.windows.model_map.windows()
        await runtime.start()
        settle_heap()
        try:
            yield
        finally:
            await runtime.close()
            metrics.process_exiting()

    async def gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        return exc.response(anthropic=anthropic_path(request.url.path))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = (
            f"Invalid URL ({request.method} {request.url.path})" if exc.status_code == 404 else exc.detail
        )
        return GatewayError(exc.status_code, message).response(anthropic=anthropic_path(request.url.path))

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/v1/messages", anthropic_passthrough, methods=ALL_METHODS),
            Route("/v1/messages/{path:path}", anthropic_passthrough, methods=ALL_METHODS),
            Route("/v1/responses", responses, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
            Route("/v1/{path:path}", passthrough, methods=ALL_METHODS),
        ],
        exception_handlers={
            GatewayError: gateway_error,
            HTTPException: http_error,
        },
        # Outside the routes and their handlers: a bug anywhere still answers a clean 500.
        middleware=[
            Middleware(RequestGuard, lines=RequestLines(settings.server.log_format)),
            Middleware(PathGuard),
        ],
        lifespan=lifespan,
    )
    # Starlette would answer GET /v1 with a redirect to a URL built from the client's Host header.
    app.router.redirect_slashes = False
    app.state.runtime = runtime
    return app
