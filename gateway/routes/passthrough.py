"""Every /v1 route other than chat completions: relayed unchanged, bodies streamed both ways.

The path goes upstream as the client encoded it, after a check: a path that could mean another
resource once some server on the way decodes or normalises it (dot segments, encoded
separators, control characters) answers 400 instead.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from urllib.parse import quote, unquote

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from gateway.chat_request import body_too_large, read_body
from gateway.errors import GatewayError
from gateway.log_safety import printable
from gateway.proxy_headers import to_client, to_upstream, upstream_query
from gateway.runtime import Runtime

# Bodies up to this size are buffered so the request can be retried; larger ones stream.
RETRYABLE_BODY_LIMIT = 1024 * 1024


async def passthrough(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    request_id: str = request.state.request_id
    path = upstream_path(request.scope["raw_path"])
    body = await _request_body(request, runtime.settings.server.max_passthrough_body_bytes)
    api_key = runtime.settings.upstream.api_key
    reply = await runtime.upstream.send(
        request.method,
        runtime.upstream.url_for(path, upstream_query(request.url.query, api_key=api_key)),
        to_upstream(request.headers, api_key=api_key, request_id=request_id),
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


# Percent-escapes of "/" and "\\": decoded by some server on the way, they change the path.
_ENCODED_SEPARATOR = re.compile(r"%(2f|5c)", re.IGNORECASE)
_LONE_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
# RFC 3986 pchar plus "/" and "%" (escapes are kept as sent): everything else is escaped.
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"


def upstream_path(raw_path: bytes) -> str:
    """The client's path, percent-encoded, for the upstream request line; 400 when it is unsafe."""
    raw = raw_path.decode("latin-1")
    decoded = unquote(raw, errors="replace")
    problem = None
    if not decoded.isprintable():
        problem = "control characters"
    elif "\\" in raw or _ENCODED_SEPARATOR.search(raw):
        problem = "an encoded or backslash path separator"
    elif any(segment in (".", "..") for segment in decoded.split("/")):
        problem = "a dot segment"
    if problem is not None:
        raise GatewayError(
            400,
            f"Invalid URL path {printable(raw)!r}: it contains {problem}.",
            param="path",
            code="invalid_path",
        )
    return quote(_LONE_PERCENT.sub("%25", raw), safe=_PATH_SAFE)


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
