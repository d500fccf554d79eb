"""POST /v1/chat/completions: the shared prompt flow (routes/prompt.py) in chat completions' shape."""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request

from gateway.policy.enforcer import Team
from gateway.proxy.headers import client_query, to_upstream, upstream_query
from gateway.routes.prompt import Dialect, Upstreaming, prompt_endpoint
from gateway.runtime import Runtime


def openai_upstream(path: str) -> Callable[[Runtime, Request, Team | None], Upstreaming]:
    """Requests to ``path`` on the OpenAI-compatible upstream (`upstream.base_url`)."""

    def upstream(runtime: Runtime, request: Request, team: Team | None) -> Upstreaming:
        request_id: str = request.state.request_id
        api_key = runtime.upstream_key(team)
        # With teams, the caller's credential is a gateway key: it never crosses, key or no key.
        strip = team is not None
        query = upstream_query(client_query(request.scope), api_key=api_key, strip_credentials=strip)
        return Upstreaming(
            headers=to_upstream(
                request.headers,
                api_key=api_key,
                request_id=request_id,
                identity_encoding=True,
                strip_credentials=strip,
            ),
            url=runtime.upstream.url_for(path, query),  # Azure's api-version rides on the query
            gateway_credentials=bool(api_key) or strip,
        )

    return upstream


chat_completions = prompt_endpoint(Dialect(upstream=openai_upstream("/v1/chat/completions")))
