"""POST /v1/chat/completions: parse, then the shared prompt flow (routes/prompt.py)."""

from __future__ import annotations

from starlette.requests import Request

from gateway.proxy_headers import to_upstream, upstream_query
from gateway.routes.prompt import Dialect, Upstreaming, prompt_endpoint
from gateway.runtime import Runtime


def _upstream(runtime: Runtime, request: Request, request_id: str) -> Upstreaming:
    api_key = runtime.settings.upstream.api_key
    query = upstream_query(request.url.query, api_key=api_key)  # Azure's api-version rides on it
    return Upstreaming(
        headers=to_upstream(request.headers, api_key=api_key, request_id=request_id, identity_encoding=True),
        url=runtime.upstream.url_for("/v1/chat/completions", query),
        gateway_credentials=bool(api_key),
    )


chat_completions = prompt_endpoint(Dialect(upstream=_upstream))
