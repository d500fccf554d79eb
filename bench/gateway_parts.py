"""This checkout's gateway with part of its per-request work taken out: what each part costs.

    python bench/gateway_parts.py relay|uncounted serve --port P

For bench/proxy_wrk.py's `--parts`, never for serving anyone:

- `relay`: every prompt route reads the body and relays the upstream's answer through the
  gateway's own server, middleware and upstream client; nothing is parsed, counted or fitted.
  What is left is the gateway's serving machinery, beside the floor's.
- `uncounted`: the whole prompt path (parse, validation, teams, headers, logs, metrics) except
  the exact count and the decisions made on it: the body is forwarded as it came and the token
  headers read 0. The gap to the real gateway is what the exact count costs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from starlette.requests import Request
from starlette.responses import Response

import gateway.routes.prompt as prompt
from gateway.chat_request import ChatRequest, read_body
from gateway.cli import main
from gateway.planning import Plan
from gateway.routes.prompt import Dialect
from gateway.runtime import Runtime

PARTS = ("relay", "uncounted")


async def _relay(request: Request, dialect: Dialect) -> Response:
    runtime: Runtime = request.app.state.runtime
    raw = await read_body(request, runtime.settings.server.max_body_bytes)
    upstream = dialect.upstream(runtime, request, None)
    reply = await runtime.upstream.send(
        "POST", upstream.url, upstream.headers, raw, gateway_credentials=upstream.gateway_credentials
    )
    body = await reply.read(runtime.settings.upstream.timeouts.idle)
    return Response(body, status_code=reply.status, media_type="application/json")


async def _uncounted(runtime: Runtime, chat: ChatRequest, **_: object) -> Plan:
    return Plan(chat.raw, None)


def run(part: str, argv: list[str]) -> None:
    if part == "relay":
        prompt._handle = _relay
    else:
        prompt.plan_request = _uncounted  # what every route's planner calls
    sys.argv = [sys.argv[0], *argv]
    main()


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in PARTS:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(PARTS)} serve [options]")
    run(sys.argv[1], sys.argv[2:])
