"""Every /v1 route other than chat completions: relayed unchanged, bodies streamed both ways.

The path goes upstream as the client encoded it (unsafe ones never get here: gateway.request_path).
With teams configured: authenticated, held to the team's requests-per-minute limit, and, for a
team with a model allow-list, every ``model`` the body names (JSON or form) checked against it
(embeddings, transcriptions, image edits …: no route may reach a model the team may not use):
a JSON or urlencoded body read whole within ``server.max_body_bytes``; a multipart upload (up
to ``max_passthrough_body_bytes``, hundreds of megabytes) read as it streams on, each piece sent
once the next is read and the last once the whole form was judged, so a refused upload never
reaches the upstream complete.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from functools import partial

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from yarl import URL

from gateway.chat_request import body_too_large, check_codings, read_body
from gateway.errors import GatewayError
from gateway.policy.answers import without_rate_limits
from gateway.policy.batch_input import creates_batch, input_file_id, input_file_models
from gateway.policy.enforcer import Team
from gateway.policy.named_models import MULTIPART, FormScan, media_type, models_named, query_models
from gateway.proxy.headers import client_query, to_client, to_upstream, upstream_query
from gateway.proxy.relay import RelayStream
from gateway.request_path import upstream_path
from gateway.runtime import Runtime
from gateway.server.protocol import client_gone

# What described the client's body, not the body-less request that fetches a batch's input file.
_BODY_HEADERS = frozenset({"content-length", "content-type", "transfer-encoding", "expect"})
# Bodies up to this size are buffered so the request can be retried; larger ones stream.
RETRYABLE_BODY_LIMIT = 1024 * 1024


async def passthrough(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    path = upstream_path(request.scope["raw_path"])
    return await relay_unchanged(
        request, lambda query: runtime.upstream.url_for(path, query), runtime.upstream_key
    )


async def relay_unchanged(
    request: Request,
    url_for: Callable[[str], URL],
    key_for: Callable[[Team | None], str | None],
    *,
    key_header: str = "authorization",
) -> Response:
    """Send the request as it came to ``url_for(query)``, with ``key_for(team)`` as the key when
    there is one (``key_header``: ``authorization`` or Anthropic's ``x-api-key``), and relay the
    answer as it comes."""
    runtime: Runtime = request.app.state.runtime
    request_id: str = request.state.request_id
    team = runtime.policy.authenticate(request.headers)
    limit = runtime.settings.server.max_passthrough_body_bytes
    body: bytes | _Upload | None
    content_type = request.headers.get("content-type", "")
    listed = team if team is not None and team.settings.models is not None else None
    if listed is not None:
        check_codings(request.headers)  # a compressed body's models cannot be read
        if len(request.headers.getlist("content-type")) > 1:  # parsers differ on which one holds
            raise GatewayError(
                400, "The request names its Content-Type more than once.", param="content-type"
            )
        for model in query_models(request.scope["query_string"]):
            runtime.policy.check_model(listed, model)
    if listed is not None and media_type(content_type) == MULTIPART:
        # An upload: its models are read as it streams on (gateway.policy.named_models.FormScan).
        scan = _TeamFormScan(
            runtime,
            listed,
            FormScan(content_type, runtime.settings.server.max_body_bytes, listed.settings.allows_model),
        )
        body = await _request_body(request, limit, scan)
        if not isinstance(body, _Upload):
            scan.feed(body or b"")
            scan.finish()
    elif listed is not None:
        # The whole body is needed to read its model: buffered, within the request body limit.
        whole = await read_body(request, runtime.settings.server.max_body_bytes)
        for model in models_named(whole, content_type):
            runtime.policy.check_model(listed, model)
        if creates_batch(request.method, request.scope["path"]):
            await _check_batch_input(
                request, listed, input_file_id(whole), runtime.settings.server.max_body_bytes
            )
        has_body = whole or "content-length" in request.headers or "transfer-encoding" in request.headers
        body = whole if has_body else None
    else:
        body = await _request_body(request, limit)
    if isinstance(body, bytes) and await client_gone(request):
        raise ClientDisconnect  # nobody would read the answer: the upstream is not called
    admission = await runtime.policy.admit(team, None) if team is not None else None
    api_key = key_for(team)
    strip = team is not None  # the caller's credential is a gateway key: it never crosses
    try:
        reply = await runtime.upstream.send(
            request.method,
            url_for(upstream_query(client_query(request.scope), api_key=api_key, strip_credentials=strip)),
            to_upstream(
                request.headers,
                api_key=api_key,
                request_id=request_id,
                strip_credentials=strip,
                key_header=key_header,
            ),
            body.chunks() if isinstance(body, _Upload) else body,
            gateway_credentials=bool(api_key) or strip,
        )
    except GatewayError:
        if isinstance(body, _Upload) and body.failure is not None:
            raise body.failure from None  # the client left mid-upload, or sent too much
        raise
    if admission is None:
        headers = to_client(reply.headers, request_id=request_id)
    else:
        headers = to_client(
            without_rate_limits(reply.headers), request_id=request_id, extra=admission.headers
        )
    if reply.content_length is not None:
        headers.append((b"content-length", str(reply.content_length).encode()))
    if reply.response is None or request.method == "HEAD":
        reply.close()
        content = b"" if request.method == "HEAD" else reply.buffered_body or b""
        response = Response(content, status_code=reply.status)
    else:
        idle = runtime.settings.upstream.timeouts.idle
        response = RelayStream(reply.iter_body(idle), status_code=reply.status)
    response.raw_headers = headers
    return response


async def _check_batch_input(request: Request, team: Team, file_id: str, max_line_bytes: int) -> None:
    """Every model the batch's input file names is one the team may use: the file is read from
    the upstream with the team's credentials (gateway.policy.batch_input)."""
    runtime: Runtime = request.app.state.runtime
    api_key = runtime.upstream_key(team)
    query = upstream_query(client_query(request.scope), api_key=api_key, strip_credentials=True)
    headers = to_upstream(
        request.headers, api_key=api_key, request_id=request.state.request_id, strip_credentials=True
    )
    reply = await runtime.upstream.send(
        "GET",
        runtime.upstream.url_for(f"/v1/files/{file_id}/content", query),
        [(name, value) for name, value in headers if name.lower() not in _BODY_HEADERS],
        None,
        gateway_credentials=True,
    )
    if reply.status != 200 or reply.response is None:
        reply.close()
        raise GatewayError(
            502 if reply.status >= 500 else 400,
            f"The batch's input file {file_id!r} could not be read from the upstream (HTTP "
            f"{reply.status}) to check the models it names.",
            param="input_file_id",
        )
    idle = runtime.settings.upstream.timeouts.idle
    async with (
        aclosing(reply.read_chunks(idle)) as chunks,
        aclosing(input_file_models(chunks, max_line_bytes)) as models,
    ):
        async for model in models:
            runtime.policy.check_model(team, model)


async def _request_body(
    request: Request, limit: int, scan: _TeamFormScan | None = None
) -> bytes | _Upload | None:
    declared = request.headers.get("content-length")
    chunked = "chunked" in request.headers.get("transfer-encoding", "").lower()
    if declared is None and not chunked:
        return None
    if declared is not None and declared.isdigit() and int(declared) <= RETRYABLE_BODY_LIMIT:
        return await read_body(request, limit)
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise body_too_large(limit)
    return _Upload(request, limit, scan)


class _TeamFormScan:
    """A FormScan whose answer is held to the team's list (answering as `check_model` does)."""

    def __init__(self, runtime: Runtime, team: Team, scan: FormScan) -> None:
        self._check = partial(runtime.policy.check_model, team)
        self._scan = scan

    def feed(self, chunk: bytes) -> None:
        if (refused := self._scan.feed(chunk)) is not None:
            self._check(refused)

    def finish(self) -> None:
        if (refused := self._scan.finish()) is not None:
            self._check(refused)


class _Upload:
    """A request body streamed upstream, at most ``limit`` bytes.

    aiohttp turns whatever the body's iterator raises into a connection error (which would
    answer 502, "upstream unreachable"); the real cause is kept here so the route raises it.
    """

    def __init__(self, request: Request, limit: int, scan: _TeamFormScan | None) -> None:
        self.request = request
        self.limit = limit
        self.scan = scan
        self.failure: Exception | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        size = 0
        held = b""  # with a scan, each piece goes on once the next is read, the last once all is
        try:
            async for chunk in self.request.stream():
                size += len(chunk)
                if size > self.limit:
                    # Too late for a 413 before the upstream request: abort the upload.
                    raise body_too_large(self.limit)
                if not chunk:
                    continue
                if self.scan is None:
                    yield chunk
                    continue
                self.scan.feed(chunk)
                if held:
                    yield held
                held = chunk
            if self.scan is not None:
                self.scan.finish()
            if held:
                yield held
        except (ClientDisconnect, GatewayError) as exc:
            self.failure = exc
            raise
