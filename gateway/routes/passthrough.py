"""Every /v1 route other than chat completions: relayed unchanged, bodies streamed both ways."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from yarl import URL

from gateway.chat_request import body_too_large, read_body
from gateway.errors import GatewayError
from gateway.proxy_headers import to_client, to_upstream, upstream_query
from gateway.runtime import Runtime

# Bodies up to this size are buffered so the request can be retried; larger ones stream.
RETRYABLE_BODY_LIMIT = 1024 * 1024


async def passthrough(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    api_key = runtime.settings.upstream.api_key
    url = runtime.upstream.url_for(request.url.path, upstream_query(request.url.query, api_key=api_key))
    return await relay_unchanged(request, url, api_key=api_key)


async def relay_unchanged(
    request: Request, url: URL, *, api_key: str | None, key_header: str = "authorization"
) -> Response:
    """Send the request to ``url`` as it came (the configured key replacing client credentials)
    and relay the answer as it comes."""
    runtime: Runtime = request.app.state.runtime
    request_id: str = request.state.request_id
    body = await _request_body(request, runtime.settings.server.max_body_bytes)
    reply = await runtime.upstream.send(
        request.method,
        url,
        to_upstream(request.headers, api_key=api_key, request_id=request_id, key_header=key_header),
        body,
        gateway_credentials=bool(api_key),
    )
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


async def _request_body(request: Request, limit: int) -> bytes | AsyncIterator[bytes] | None:
    declared = request.headers.get("content-length")
    chunked = "chunked" in request.headers.get("transfer-encoding", "").lower()
    if declared is None and not chunked:
        return None
    if declared is not None and declared.isdigit() and int(declared) <= RETRYABLE_BODY_LIMIT:
        return await read_body(request, limit)
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise body_too_large(limit)
    return _limited_stream(request, limit)


async def _limited_stream(request: Request, limit: int) -> AsyncIterator[bytes]:
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            # Too late for a 413 (the upstream request has started): abort the upload.
            raise GatewayError(413, "Request body exceeded the gateway's limit while streaming.")
        if chunk:
            yield chunk
