"""Every /v1 route other than chat completions: relayed unchanged, bodies streamed both ways.

The path goes upstream as the client encoded it (unsafe ones never get here: gateway.request_path).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from yarl import URL

from gateway.chat_request import body_too_large, read_body
from gateway.errors import GatewayError
from gateway.proxy_headers import to_client, to_upstream, upstream_query
from gateway.request_path import upstream_path
from gateway.runtime import Runtime

# Bodies up to this size are buffered so the request can be retried; larger ones stream.
RETRYABLE_BODY_LIMIT = 1024 * 1024


async def passthrough(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    api_key = runtime.settings.upstream.api_key
    path = upstream_path(request.scope["raw_path"])
    url = runtime.upstream.url_for(path, upstream_query(request.url.query, api_key=api_key))
    return await relay_unchanged(request, url, api_key=api_key)


async def relay_unchanged(
    request: Request, url: URL, *, api_key: str | None, key_header: str = "authorization"
) -> Response:
    """Send the request to ``url`` as it came (the configured key replacing client credentials)
    and relay the answer as it comes."""
    runtime: Runtime = request.app.state.runtime
    request_id: str = request.state.request_id
    body = await _request_body(request, runtime.settings.server.max_passthrough_body_bytes)
    try:
        reply = await runtime.upstream.send(
            request.method,
            url,
            to_upstream(request.headers, api_key=api_key, request_id=request_id, key_header=key_header),
            body.chunks() if isinstance(body, _Upload) else body,
            gateway_credentials=bool(api_key),
        )
    except GatewayError:
        if isinstance(body, _Upload) and body.failure is not None:
            raise body.failure from None  # the client left mid-upload, or sent too much
        raise
    headers = to_client(reply.headers, request_id=request_id)
    if reply.content_length is not None:
        headers.append((b"content-length", str(reply.content_length).encode()))
    if reply.response is None or request.method == "HEAD":
        reply.close()
        content = b"" if request.method == "HEAD" else reply.buffered_body or b""
        response = Response(content, status_code=reply.status)
    else:
        idle = runtime.settings.upstream.timeouts.idle
        response = StreamingResponse(reply.iter_body(idle), status_code=reply.status)
    response.raw_headers = headers
    return response


async def _request_body(request: Request, limit: int) -> bytes | _Upload | None:
    declared = request.headers.get("content-length")
    chunked = "chunked" in request.headers.get("transfer-encoding", "").lower()
    if declared is None and not chunked:
        return None
    if declared is not None and declared.isdigit() and int(declared) <= RETRYABLE_BODY_LIMIT:
        return await read_body(request, limit)
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise body_too_large(limit)
    return _Upload(request, limit)


class _Upload:
    """A request body streamed upstream, at most ``limit`` bytes.

    aiohttp turns whatever the body's iterator raises into a connection error (which would
    answer 502, "upstream unreachable"); the real cause is kept here so the route raises it.
    """

    def __init__(self, request: Request, limit: int) -> None:
        self.request = request
        self.limit = limit
        self.failure: Exception | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        size = 0
        try:
            async for chunk in self.request.stream():
                size += len(chunk)
                if size > self.limit:
                    # Too late for a 413 before the upstream request: abort the upload.
                    raise body_too_large(self.limit)
                if chunk:
                    yield chunk
        except (ClientDisconnect, GatewayError) as exc:
            self.failure = exc
            raise
