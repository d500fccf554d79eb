"""POST /v1/chat/completions: parse, then the shared prompt flow (routes/prompt.py)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from gateway.chat_request import parse_chat_request, read_body
from gateway.proxy_headers import to_upstream, upstream_query
from gateway.routes.prompt import Dialect, Upstreaming, forward_prompt
from gateway.runtime import Runtime


def _upstream(runtime: Runtime, request: Request, request_id: str) -> Upstreaming:
    api_key = runtime.settings.upstream.api_key
    query = upstream_query(request.url.query, api_key=api_key)  # Azure's api-version rides on it
    return Upstreaming(
        headers=to_upstream(request.headers, api_key=api_key, request_id=request_id, identity_encoding=True),
        url=runtime.upstream.url_for("/v1/chat/completions", query),
        gateway_credentials=bool(api_key),
    )


CHAT_COMPLETIONS = Dialect(upstream=_upstream)


async def chat_completions(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    raw = await read_body(request, runtime.settings.server.max_body_bytes)
    return await forward_prompt(request, parse_chat_request(raw, request.headers), CHAT_COMPLETIONS)
