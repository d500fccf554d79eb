"""The outermost guard around every request: its id, its count, and a clean 500 for any bug.

Starlette's own handler for unexpected exceptions answers, then re-raises: uvicorn then logs a
full traceback (which may quote request data) and the client's keep-alive connection is left
in a state where its next request is reset. Here an unexpected exception is logged as one line
with the request id, answered as an OpenAI-shaped 500 with ``Connection: close``, and not raised
further. Every answer — the gateway's own errors included — carries ``x-gateway-request-id``,
is counted and timed in the request metrics, and gets its one log line (gateway.request_log)
once its last byte is sent.
"""

from __future__ import annotations

import logging
import time

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import metrics
from gateway.errors import GatewayError, anthropic_path
from gateway.log_safety import printable
from gateway.proxy.headers import GATEWAY_REQUEST_ID, request_id_for
from gateway.request_log import RequestLines, RequestRecord
from gateway.request_path import prompt_route_alias

log = logging.getLogger("gateway")

_GATEWAY_REQUEST_ID = GATEWAY_REQUEST_ID.encode()
# Route label values: a fixed set, whatever paths clients invent.
_ROUTES = {
    "/v1/chat/completions": "chat_completions",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
    "/healthz": "healthz",
    "/readyz": "readyz",
    "/metrics": "metrics",
}
# Set in the scope by the server's protocol when it refuses a request the app is reading (a body
# that stalled): the status the client got, where the app itself only saw the connection close.
REFUSED_STATUS = "gateway.refused_status"
# Probes and scrapes arrive every few seconds from every kubelet and Prometheus: counted, not logged.
_UNLOGGED_ROUTES = {"healthz", "readyz", "metrics"}


def route_label(path: str) -> str:
    """The route's label; another spelling of a prompt route (`/v1//chat/completions`) is served,
    counted and logged as that route."""
    label = _ROUTES.get(path) or _ROUTES.get(prompt_route_alias(path) or "")
    return label or ("passthrough" if path.startswith("/v1/") else "other")


class RequestGuard:
    def __init__(self, app: ASGIApp, lines: RequestLines) -> None:
        self.app = app
        self.lines = lines

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_for(Headers(scope=scope))
        record = RequestRecord(request_id, scope["method"], route_label(scope["path"]))
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["record"] = record
        status = 0
        # Probes and scrapes are not load: a scrape counted itself, so the gauge never read 0.
        counted = record.route not in _UNLOGGED_ROUTES
        if counted:
            metrics.IN_FLIGHT.inc()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = message.get("headers", [])
                if not any(name == _GATEWAY_REQUEST_ID for name, _ in headers):
                    headers = [*headers, (_GATEWAY_REQUEST_ID, request_id.encode("latin-1"))]
                    message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:
            # The client hung up (while sending its body, or while the gateway worked): nobody is
            # left to answer.
            status = scope.get(REFUSED_STATUS, 499)
            if status == 499:
                log.info("client disconnected before its answer (request %s)", request_id)
        except Exception as exc:
            log.error(
                "unhandled %s on %s %s (request %s)",
                type(exc).__name__,
                scope["method"],
                printable(scope["path"]),
                request_id,
            )
            if status == 0:
                await _answer_500(send, request_id, anthropic=anthropic_path(scope["path"]))
                status = 500
            # Otherwise the answer had started: returning without finishing it makes uvicorn close
            # the connection, so the client sees a broken transfer, not a complete-looking one.
        finally:
            if counted:
                metrics.IN_FLIGHT.dec()
            record.status = status
            status_class = metrics.status_class(status)
            metrics.REQUESTS.labels(record.route, status_class).inc()
            metrics.REQUEST_DURATION.labels(record.route, status_class).observe(
                time.perf_counter() - record.started
            )
            if record.route not in _UNLOGGED_ROUTES:
                self.lines.write(record)


async def _answer_500(send: Send, request_id: str, *, anthropic: bool) -> None:
    error = GatewayError(500, "The gateway failed to handle this request.", type="server_error")
    body = error.anthropic_body() if anthropic else error.body()
    await send(
        {
            "type": "http.response.start",
            "status": 500,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                (_GATEWAY_REQUEST_ID, request_id.encode("latin-1")),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
