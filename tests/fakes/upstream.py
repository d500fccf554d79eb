"""A fake OpenAI upstream: real HTTP, strict validation, its own token count, injectable faults.

Every integration test, benchmark and fault-injection test talks to this
instead of a provider. It behaves like the OpenAI API where the gateway can
tell the difference: error bodies and wording, SSE framing, response headers,
usage numbers, and a strict check that tool calls are paired.

Routes
    POST   /v1/chat/completions   echo answer (or a tool call), stream or not; window check
    POST   /v1/responses          Responses API (tests/fakes/responses_api.py): strict items,
                                  stored state (previous_response_id, conversation),
                                  truncation, overflow; JSON or its SSE events
    POST   /v1/responses/input_tokens   the input's token count, server history included
    POST   /v1/messages           Anthropic Messages API (tests/fakes/anthropic_api.py): x-api-key,
                                  anthropic-version, strict blocks, pairs, signed thinking,
                                  cache_control limit, both overflow wordings; JSON or SSE
    POST   /v1/messages/count_tokens   {"input_tokens": N}
    POST   /v1/embeddings         deterministic unit vectors (floats or base64)
    GET    /v1/models, /v1/models/{id}   with `model_cards`: served models and their windows
    POST   /api/show, GET /api/ps         Ollama's native API, when `ollama_models` is set
    GET    /props                         llama.cpp's server properties, when `llamacpp_props` is set
    DELETE /v1/files/{id}
    GET    /v1/files/{id}/content  a file of `files` (uploaded by any route), else OpenAI's 404
    POST   /v1/batches            a batch over a `files` entry: input_file_id, endpoint and
                                  completion_window checked as OpenAI does; answers `validating`
    anything else                 404 "Invalid URL (METHOD /path)"; a known path with
                                  the wrong method gets 405 "Invalid method for URL (...)"

Usage numbers: with `window` set (or a fault that needs it) prompt tokens are
counted exactly (tests/fakes/tokens.py); otherwise they are estimated from the
body size so the fake stays cheap under benchmark load.

Faults. Consumed one per chat-completions request from `fake.faults` (a list;
a None entry means "answer normally", so ["503", "503"] is "fail twice, then
succeed"), or forced on any route by the request header `x-fake-fault: MODE`
(which then leaves the queue alone). An unknown mode answers 400.

    reset        headers and part of the body (half the JSON, or the first
                 half of the SSE events), then a TCP reset (RST)
    half_stream  the same, then a clean close (FIN): a stream without [DONE]
    stall        the same, then silence for `hang_seconds`, then the rest
    hang         silence for `hang_seconds` before any byte, then the answer
    429          rate-limit body (code rate_limit_exceeded), `retry-after: retry_after`
    500          OpenAI's server_error body
    502          the CDN's HTML "502 Bad Gateway" page
    503          "The server is overloaded or not ready yet." (server_error)
    overflow     the context_length_exceeded 400 in `overflow_style`, whatever
                 the size (window reported: `window`, or prompt tokens - 1)
    truncate     Ollama-like: no window check, usage.prompt_tokens capped at
                 `truncate_to`

"Refused connection" is not a mode: point the client at `serve.free_port()`.

Run alone (benchmarks):
    python -m tests.fakes.upstream --port 9000 --window 128000 [--chunk-delay 0.01]
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from tests.fakes import answers, anthropic_api, errors, responses_api
from tests.fakes.delivery import RAW_SEND, Reply, deliver, json_reply, sse_reply
from tests.fakes.errors import OverflowStyle
from tests.fakes.faults import ERROR_STATUS, Fault
from tests.fakes.responses_api import ResponsesState
from tests.fakes.tokens import count_prompt, count_text, estimate, warm_up
from tests.fakes.validation import (
    alternates,
    check_final_thinking,
    check_reasoning_passed_back,
    thinking_enabled,
    thinking_mode,
    validate_chat_messages,
)

FAULT_HEADER = "x-fake-fault"
CREATED_BASE = 1_750_000_000
RATE_LIMIT_REQUESTS = 10_000
RATE_LIMIT_TOKENS = 30_000_000


@dataclass(frozen=True)
class ReceivedRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    """Lower-cased names; repeated headers joined with ", "."""
    body: bytes
    json: Any
    """The parsed body, or None when it is empty or not JSON."""
    time: float
    """time.monotonic() on arrival."""


@dataclass(eq=False)
class FakeUpstream:
    """Behaviour knobs and observations of one fake upstream. Tests mutate it freely between requests."""

    window: int | None = None
    """Context window in tokens; None disables the check."""
    overflow_style: OverflowStyle = "openai"
    chunk_delay: float = 0.0
    """Seconds between SSE events."""
    required_api_key: str | None = None
    faults: list[str | None] = field(default_factory=list)
    retry_after: float = 1.0
    hang_seconds: float = 60.0
    truncate_to: int = 2048
    stated_window: int | None = None
    """The window overflow errors state when it is not the real one: an upstream echoing some
    other number ("maximum context length is 20 tokens")."""
    model_cards: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Served models listed by GET /v1/models with their server's own fields:
    {"m": {"max_model_len": 4096}} (vLLM, SGLang), {"m": {"context_length": 8192}} (OpenRouter)."""
    ollama_models: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Ollama's native API per model name: {"m:8b": {"show": <POST /api/show body>, "ps": <GET
    /api/ps entry>, or only one}}. Empty: /api/* answers 404 like any non-Ollama server."""
    llamacpp_props: dict[str, Any] | None = None
    """llama.cpp's GET /props body; None: 404."""
    alternating_roles: bool = False
    """Serve chat completions as vLLM does a model whose chat template needs user and assistant
    messages to alternate after the system prompt (Gemma's): two in a row answer 400."""
    files: dict[str, bytes] = field(default_factory=dict)
    """Stored files by id, as if uploaded (a batch's input file: JSON Lines)."""
    log_requests: bool = True
    """Keep every request in `received`; off for long benchmark runs, where it would grow without bound."""

    responses_state: ResponsesState = field(default_factory=ResponsesState)
    """Stored responses and conversations of the Responses API (previous_response_id, conversation)."""
    responses_inputs: list[list[dict[str, Any]]] = field(default_factory=list)
    """The full input (server history included) of every Responses request answered."""
    anthropic_inputs: list[dict[str, Any]] = field(default_factory=list)
    """The body of every Messages request answered."""

    received: list[ReceivedRequest] = field(default_factory=list)
    hits: Counter[str] = field(default_factory=Counter)
    """Requests per path."""
    cancelled_streams: int = 0
    """Streams whose client went away before the end."""
    cancelled_requests: int = 0
    """Non-stream replies (delayed by hang/stall) whose client went away before the end."""
    serial: int = 0
    """Numbers ids ("chatcmpl-fake-N") and `created`, so answers are reproducible."""

    active_streams: int = 0
    """Streams being generated right now. A live gauge: reset() leaves it alone."""
    base_url: str = ""
    """"http://127.0.0.1:PORT/v1" once served; reset() leaves it alone."""

    def reset(self) -> None:
        """Back to defaults: knobs, faults, log and counters (not the live gauge or the URL)."""
        fresh = FakeUpstream()
        for f in fields(self):
            if f.name not in ("active_streams", "base_url"):
                setattr(self, f.name, getattr(fresh, f.name))

    def next_serial(self) -> int:
        self.serial += 1
        return self.serial

    def requests_to(self, path: str) -> list[ReceivedRequest]:
        return [request for request in self.received if request.path == path]


@dataclass(frozen=True)
class Call:
    """One request as the route builders see it."""

    method: str
    path: str
    path_params: Mapping[str, str]
    body: bytes
    json: Any
    fault: Fault | None
    headers: Mapping[str, str] = field(default_factory=dict)


Builder = Callable[[FakeUpstream, Call], Reply]


def _error(status: int, message: str, *, param: str | None = None, code: str | None = None) -> Reply:
    return json_reply(status, errors.openai_error(message, param=param, code=code))


def _completion_budget(body: Mapping[str, Any]) -> int:
    value = body.get("max_completion_tokens") or body.get("max_tokens")
    return value if isinstance(value, int) else 0


def chat_completions(fake: FakeUpstream, call: Call) -> Reply:
    body = call.json
    if not isinstance(body, dict):
        return _error(400, errors.BAD_JSON)
    if "model" not in body:
        return _error(400, "you must provide a model parameter")
    if "messages" not in body:
        return _error(400, "Missing required parameter: 'messages'.", param="messages")
    invalid = validate_chat_messages(body["messages"])
    if invalid is not None:
        message, param = invalid
        return _error(400, message, param=param)
    missing = check_reasoning_passed_back(body["messages"]) if thinking_mode(body) else None
    claude = thinking_enabled(body) and str(body.get("model", "")).startswith("claude")
    missing = missing or (check_final_thinking(body["messages"]) if claude else None)
    if missing is not None:
        return _error(400, missing)
    if fake.alternating_roles and not alternates(body["messages"]):
        message = "Conversation roles must alternate user/assistant/user/assistant/..."
        vllm_error = {"object": "error", "message": message, "type": "BadRequestError", "code": 400}
        return json_reply(400, vllm_error)

    exact = fake.window is not None or call.fault in (Fault.OVERFLOW, Fault.TRUNCATE)
    prompt = count_prompt(body) if exact else estimate(call.body)
    reserved = _completion_budget(body)
    too_long = fake.window is not None and prompt + reserved > fake.window
    if call.fault is Fault.OVERFLOW or (too_long and call.fault is not Fault.TRUNCATE):
        window = fake.window if fake.window is not None else max(1, prompt - 1)
        window = window if fake.stated_window is None else fake.stated_window
        payload = errors.overflow(
            fake.overflow_style, window=window, prompt_tokens=prompt, completion_tokens=reserved
        )
        return json_reply(400, payload)
    if call.fault is Fault.TRUNCATE:
        prompt = min(prompt, fake.truncate_to)

    serial = fake.next_serial()
    answer = answers.chat_answer(body, call_id=f"call_fake_{serial}")
    completion = count_text(answer.spoken) if exact else estimate(answer.spoken)
    usage = answers.Usage(prompt, completion)
    identity = answers.Identity(f"chatcmpl-fake-{serial}", CREATED_BASE + serial, str(body["model"]))
    if body.get("stream") is True:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return sse_reply(
            answers.chat_events(identity, answer=answer, usage=usage, include_usage=include_usage)
        )
    return json_reply(200, answers.chat_completion(identity, answer=answer, usage=usage))


def _responses_refusal(fake: FakeUpstream, body: object, *, counting: bool = False) -> Reply | None:
    """`counting`: for POST /v1/responses/input_tokens, whose `model` is optional."""
    if not isinstance(body, dict):
        return _error(400, errors.BAD_JSON)
    invalid = responses_api.validate(body, fake.responses_state, model_required=not counting)
    if invalid is None:
        return None
    status, message, param, code = invalid
    return _error(status, message, param=param, code=code)


def responses(fake: FakeUpstream, call: Call) -> Reply:
    body = call.json
    refused = _responses_refusal(fake, body)
    if refused is not None:
        return refused
    new_items = responses_api.as_items(body.get("input"))
    items = responses_api.history(body, fake.responses_state) + new_items
    exact = fake.window is not None or call.fault is Fault.OVERFLOW
    prompt = (
        responses_api.count_input(body.get("instructions"), items, body.get("tools"))
        if exact
        else estimate(call.body)
    )
    reserved = body.get("max_output_tokens") if isinstance(body.get("max_output_tokens"), int) else 0
    serial = fake.next_serial()
    model = body.get("model") or f"prompt:{body['prompt'].get('id')}"  # a stored prompt names its model
    identity = answers.Identity(f"resp_fake_{serial}", CREATED_BASE + serial, str(model))
    too_long = fake.window is not None and prompt + reserved > fake.window
    if call.fault is Fault.OVERFLOW or too_long:
        if body.get("truncation") == "auto" and call.fault is not Fault.OVERFLOW and fake.window is not None:
            fixed = prompt - sum(responses_api.count_item(item) for item in items)
            items = responses_api.truncate_to_fit(items, fake.window - reserved - fixed)
            prompt = responses_api.count_input(body.get("instructions"), items, body.get("tools"))
        elif body.get("stream") is True:
            return sse_reply(responses_api.failed_events(identity, body))
        else:
            message = responses_api.OVERFLOW_MESSAGE
            return _error(400, message, param="input", code="context_length_exceeded")
    if fake.log_requests:
        fake.responses_inputs.append(items)
    output = responses_api.output_items(body, items, serial)
    if body.get("store", True) is not False:
        fake.responses_state.store(identity.id, items + output)
        fake.responses_state.remember_reasoning(output)
    conversation = body.get("conversation")
    if conversation is not None:
        key = str(conversation.get("id") if isinstance(conversation, dict) else conversation)
        fake.responses_state.conversations[key] = items + output
    spoken = responses_api.spoken(output)
    usage = answers.Usage(prompt, count_text(spoken) if exact else estimate(spoken))
    if body.get("stream") is True:
        return sse_reply(responses_api.events(identity, body, output, usage))
    return json_reply(
        200, responses_api.response(identity, body, status="completed", output=output, usage=usage)
    )


def responses_input_tokens(fake: FakeUpstream, call: Call) -> Reply:
    body = call.json
    refused = _responses_refusal(fake, body, counting=True)
    if refused is not None:
        return refused
    items = responses_api.history(body, fake.responses_state) + responses_api.as_items(body.get("input"))
    tokens = responses_api.count_input(body.get("instructions"), items, body.get("tools"))
    return json_reply(200, {"object": "response.input_tokens", "input_tokens": tokens})


def _anthropic_error(status: int, kind: str, message: str) -> Reply:
    return json_reply(status, anthropic_api.error_body(kind, message, f"req_fake{uuid.uuid4().hex[:20]}"))


def _anthropic_invalid(body: object, *, count_only: bool) -> Reply | None:
    invalid = anthropic_api.validate(body, count_only=count_only)
    if invalid is None:
        return None
    kind, message = invalid
    return _anthropic_error(400, kind, message)


def messages(fake: FakeUpstream, call: Call) -> Reply:
    body = call.json
    refused = _anthropic_invalid(body, count_only=False)
    if refused is not None:
        return refused
    exact = fake.window is not None or call.fault is Fault.OVERFLOW
    prompt = anthropic_api.count_input(body) if exact else estimate(call.body)
    reserved = body["max_tokens"]
    window = fake.window
    beta = call.headers.get("anthropic-beta", "")
    stop_at_window = anthropic_api.CONTEXT_WINDOW_BETA in beta
    over = window is not None and (prompt > window or (prompt + reserved > window and not stop_at_window))
    if call.fault is Fault.OVERFLOW or over:
        stated = window if window is not None else max(1, prompt - 1)
        payload = errors.overflow(
            "anthropic", window=stated, prompt_tokens=prompt, completion_tokens=reserved
        )
        return _anthropic_error(400, "invalid_request_error", payload["error"]["message"])
    if fake.log_requests:
        fake.anthropic_inputs.append(body)
    serial = fake.next_serial()
    blocks, stop_reason = anthropic_api.answer_blocks(body, serial)
    if window is not None and prompt + reserved > window:
        stop_reason = "model_context_window_exceeded"
    spoken = anthropic_api.spoken(blocks)
    tokens = anthropic_api.usage(prompt, count_text(spoken) if exact else estimate(spoken))
    identity = answers.Identity(f"msg_fake_{serial}", CREATED_BASE + serial, str(body["model"]))
    if body.get("stream") is True:
        return sse_reply(anthropic_api.events(identity, blocks, stop_reason, tokens))
    return json_reply(200, anthropic_api.message(identity, blocks, stop_reason, tokens))


def count_tokens(fake: FakeUpstream, call: Call) -> Reply:
    refused = _anthropic_invalid(call.json, count_only=True)
    if refused is not None:
        return refused
    return json_reply(200, {"input_tokens": anthropic_api.count_input(call.json)})


def embeddings(fake: FakeUpstream, call: Call) -> Reply:
    body = call.json
    if not isinstance(body, dict):
        return _error(400, errors.BAD_JSON)
    if "input" not in body:
        return _error(400, "Missing required parameter: 'input'.", param="input")
    texts = answers.embedding_inputs(body["input"])
    if texts is None:
        return _error(
            400,
            "'$.input' is invalid. Please check the API reference: https://platform.openai.com/docs/api-reference.",
        )
    dimensions = body.get("dimensions")
    payload = answers.embeddings(
        texts=texts,
        model=str(body.get("model")),
        dimensions=dimensions
        if isinstance(dimensions, int) and dimensions > 0
        else answers.EMBEDDING_DIMENSIONS,
        base64_floats=body.get("encoding_format") == "base64",
        tokens=sum(estimate(text) for text in texts),
    )
    return json_reply(200, payload)


def list_models(fake: FakeUpstream, call: Call) -> Reply:
    return json_reply(200, answers.model_list(fake.model_cards))


def retrieve_model(fake: FakeUpstream, call: Call) -> Reply:
    name = call.path_params["model"]
    if name in fake.model_cards:
        return json_reply(200, {**answers.model_object(name), **fake.model_cards[name]})
    if name not in answers.MODELS:
        message = f"The model `{name}` does not exist or you do not have access to it."
        return _error(404, message, param="model", code="model_not_found")
    return json_reply(200, answers.model_object(name))


def ollama_show(fake: FakeUpstream, call: Call) -> Reply:
    if not fake.ollama_models:
        return invalid_url(fake, call)
    name = call.json.get("model") if isinstance(call.json, dict) else None
    model = fake.ollama_models.get(str(name)) or fake.ollama_models.get(f"{name}:latest")
    if model is None or "show" not in model:
        return json_reply(404, {"error": f"model '{name}' not found"})
    return json_reply(200, model["show"])


def ollama_ps(fake: FakeUpstream, call: Call) -> Reply:
    if not fake.ollama_models:
        return invalid_url(fake, call)
    loaded = [
        {"name": name, "model": name, **model["ps"]}
        for name, model in fake.ollama_models.items()
        if "ps" in model
    ]
    return json_reply(200, {"models": loaded})


def llamacpp_props(fake: FakeUpstream, call: Call) -> Reply:
    if fake.llamacpp_props is None:
        return invalid_url(fake, call)
    return json_reply(200, fake.llamacpp_props)


def delete_file(fake: FakeUpstream, call: Call) -> Reply:
    return json_reply(200, {"id": call.path_params["file_id"], "object": "file", "deleted": True})


def file_content(fake: FakeUpstream, call: Call) -> Reply:
    file_id = call.path_params["file_id"]
    if file_id not in fake.files:
        return _error(404, f"No such File object: {file_id}", param="id")
    return Reply(200, fake.files[file_id], content_type="application/octet-stream")


BATCH_ENDPOINTS = ("/v1/responses", "/v1/chat/completions", "/v1/embeddings", "/v1/completions")


def create_batch(fake: FakeUpstream, call: Call) -> Reply:
    body = call.json
    if not isinstance(body, dict):
        return _error(400, errors.BAD_JSON)
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str) or file_id not in fake.files:
        return _error(400, f"Invalid 'input_file_id': {file_id!r}.", param="input_file_id")
    if body.get("endpoint") not in BATCH_ENDPOINTS:
        return _error(400, f"Invalid 'endpoint': {body.get('endpoint')!r}.", param="endpoint")
    if body.get("completion_window") != "24h":
        message = f"Invalid 'completion_window': {body.get('completion_window')!r}."
        return _error(400, message, param="completion_window")
    batch = {
        "id": f"batch_{uuid.uuid4().hex}",
        "object": "batch",
        "endpoint": body["endpoint"],
        "input_file_id": file_id,
        "completion_window": "24h",
        "status": "validating",
        "created_at": int(time.time()),
    }
    return json_reply(200, batch)


def invalid_url(fake: FakeUpstream, call: Call) -> Reply:
    if call.path.startswith("/v1/messages"):  # Anthropic's host answers in its own shape
        return _anthropic_error(404, "not_found_error", "Not Found")
    return _error(404, f"Invalid URL ({call.method} {call.path})")


def invalid_method(fake: FakeUpstream, call: Call) -> Reply:
    if call.path.startswith("/v1/messages"):
        return _anthropic_error(405, "invalid_request_error", f"Method Not Allowed: {call.method}")
    return _error(405, f"Invalid method for URL ({call.method} {call.path})")


def _error_status_reply(fault: Fault, fake: FakeUpstream, model: str) -> Reply:
    if fault is Fault.RATE_LIMITED:
        headers = {"retry-after": f"{fake.retry_after:g}", "x-ratelimit-remaining-requests": "0"}
        return json_reply(429, errors.rate_limited(model, fake.retry_after), headers)
    if fault is Fault.SERVER_ERROR:
        return json_reply(500, errors.openai_error(errors.SERVER_ERROR, type="server_error"))
    if fault is Fault.OVERLOADED:
        return json_reply(503, errors.openai_error(errors.OVERLOADED, type="server_error"))
    return Reply(502, errors.BAD_GATEWAY_HTML.encode(), content_type="text/html")


def _headers(scope: Scope) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope["headers"]:
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def _parse(body: bytes) -> Any:
    if not body:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _openai_headers(started: float) -> dict[str, str]:
    return {
        "x-request-id": f"req_{uuid.uuid4().hex}",
        "openai-processing-ms": str(round((time.perf_counter() - started) * 1000)),
        "openai-version": "2020-10-01",
        "x-ratelimit-limit-requests": str(RATE_LIMIT_REQUESTS),
        "x-ratelimit-limit-tokens": str(RATE_LIMIT_TOKENS),
        "x-ratelimit-remaining-requests": str(RATE_LIMIT_REQUESTS - 1),
        "x-ratelimit-remaining-tokens": str(RATE_LIMIT_TOKENS - 1000),
        "x-ratelimit-reset-requests": "6ms",
        "x-ratelimit-reset-tokens": "2ms",
    }


def _anthropic_headers() -> dict[str, str]:
    return {
        "request-id": f"req_{uuid.uuid4().hex[:24]}",
        "anthropic-organization-id": "fake-org",
        "anthropic-ratelimit-requests-limit": str(RATE_LIMIT_REQUESTS),
        "anthropic-ratelimit-requests-remaining": str(RATE_LIMIT_REQUESTS - 1),
        "anthropic-ratelimit-input-tokens-limit": str(RATE_LIMIT_TOKENS),
    }


def _anthropic_refusal(fake: FakeUpstream, headers: Mapping[str, str]) -> Reply | None:
    """The checks the real API makes before reading the body: its version header, then the key."""
    if "anthropic-version" not in headers:
        return _anthropic_error(400, "invalid_request_error", "anthropic-version: header is required")
    required = fake.required_api_key
    if required is None:
        return None
    key = headers.get("x-api-key", "")
    if not key:
        return _anthropic_error(401, "authentication_error", "x-api-key header is required")
    if key != required:
        return _anthropic_error(401, "authentication_error", "invalid x-api-key")
    return None


def _anthropic_error_status_reply(fault: Fault, fake: FakeUpstream) -> Reply:
    if fault is Fault.RATE_LIMITED:
        reply = _anthropic_error(
            429, "rate_limit_error", "Number of request tokens has exceeded your rate limit."
        )
        reply.headers["retry-after"] = f"{fake.retry_after:g}"
        return reply
    if fault is Fault.SERVER_ERROR:
        return _anthropic_error(500, "api_error", "Internal server error")
    if fault is Fault.OVERLOADED:
        return _anthropic_error(503, "overloaded_error", "Overloaded")
    return Reply(502, errors.BAD_GATEWAY_HTML.encode(), content_type="text/html")


class _Endpoint:
    """ASGI app for one route: record the request, authenticate, pick a fault, build the reply, deliver it."""

    def __init__(
        self,
        fake: FakeUpstream,
        builders: Mapping[str, Builder],
        *,
        otherwise: Builder = invalid_method,
        takes_queued_faults: bool = False,
        anthropic: bool = False,
    ) -> None:
        self.fake = fake
        self.builders = builders
        self.otherwise = otherwise
        self.takes_queued_faults = takes_queued_faults
        self.anthropic = anthropic

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        body = await Request(scope, receive).body()
        headers = _headers(scope)
        call = Call(
            scope["method"], scope["path"], scope.get("path_params", {}), body, _parse(body), None, headers
        )
        self._record(call, headers, scope["query_string"].decode("latin-1"))
        reply, fault = self._answer(call, headers)
        common = _anthropic_headers() if self.anthropic else _openai_headers(started)
        reply.headers = {**common, **reply.headers}
        await deliver(reply, fault, self.fake, scope, receive, send)

    def _record(self, call: Call, headers: dict[str, str], query: str) -> None:
        if self.fake.log_requests:
            arrived = time.monotonic()
            request = ReceivedRequest(call.method, call.path, query, headers, call.body, call.json, arrived)
            self.fake.received.append(request)
        self.fake.hits[call.path] += 1

    def _answer(self, call: Call, headers: Mapping[str, str]) -> tuple[Reply, Fault | None]:
        """The reply, and the delivery fault still to apply to it."""
        refusal = self._refusal(headers)
        if refusal is not None:
            return refusal, None
        name = self._fault_name(headers)
        try:
            fault = Fault(name) if name else None
        except ValueError:
            known = ", ".join(mode.value for mode in Fault)
            message = f"Unknown {FAULT_HEADER} mode {name!r}; known modes: {known}."
            return _error(400, message, param=FAULT_HEADER), None
        if fault in ERROR_STATUS:
            if self.anthropic:
                return _anthropic_error_status_reply(fault, self.fake), None
            model = call.json.get("model") if isinstance(call.json, dict) else None
            return _error_status_reply(fault, self.fake, str(model or "gpt-4o-mini")), None
        builder = self.builders.get(call.method, self.otherwise)
        return builder(self.fake, replace(call, fault=fault)), fault

    def _refusal(self, headers: Mapping[str, str]) -> Reply | None:
        if self.anthropic:
            return _anthropic_refusal(self.fake, headers)
        required = self.fake.required_api_key
        if required is None:
            return None
        scheme, _, key = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return _error(401, errors.NO_API_KEY)
        if key.strip() != required:
            return json_reply(401, errors.wrong_api_key(key.strip()))
        return None

    def _fault_name(self, headers: Mapping[str, str]) -> str | None:
        if FAULT_HEADER in headers:
            return headers[FAULT_HEADER]
        if self.takes_queued_faults and self.fake.faults:
            return self.fake.faults.pop(0)
        return None


class _FakeApp(Starlette):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Keep the server's own `send` before Starlette's middleware wraps it:
        # connection faults reach the transport through it (delivery._transport).
        scope[RAW_SEND] = send
        await super().__call__(scope, receive, send)


@asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    # Timing-sensitive tests (hang, stall, chunk pacing) must not see the encoding load.
    warm_up()
    yield


def create_app(fake: FakeUpstream) -> Starlette:
    def route(path: str, builders: Mapping[str, Builder], **options: Any) -> Route:
        # An ASGI endpoint and methods=None: every method reaches _Endpoint, which
        # answers a wrong one with OpenAI's 405 body rather than Starlette's.
        return Route(path, _Endpoint(fake, builders, **options), methods=None)

    return _FakeApp(
        routes=[
            route("/v1/chat/completions", {"POST": chat_completions}, takes_queued_faults=True),
            route("/v1/responses", {"POST": responses}),
            route("/v1/responses/input_tokens", {"POST": responses_input_tokens}, takes_queued_faults=True),
            route("/v1/messages", {"POST": messages}, anthropic=True),
            route("/v1/messages/count_tokens", {"POST": count_tokens}, anthropic=True),
            route("/v1/embeddings", {"POST": embeddings}),
            route("/v1/models", {"GET": list_models}),
            route("/v1/models/{model:path}", {"GET": retrieve_model}),
            route("/v1/files/{file_id}", {"DELETE": delete_file}),
            route("/v1/files/{file_id}/content", {"GET": file_content}),
            route("/v1/batches", {"POST": create_batch}),
            route("/api/show", {"POST": ollama_show}),
            route("/api/ps", {"GET": ollama_ps}),
            route("/props", {"GET": llamacpp_props}),
            route("/{path:path}", {}, otherwise=invalid_url),
        ],
        lifespan=_lifespan,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fakes.upstream", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--window", type=int, default=None, help="context window in tokens (default: none)")
    parser.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between SSE events")
    parser.add_argument("--overflow-style", choices=errors.OVERFLOW_STYLES, default="openai")
    args = parser.parse_args(argv)
    fake = FakeUpstream(
        window=args.window,
        chunk_delay=args.chunk_delay,
        overflow_style=args.overflow_style,
        log_requests=False,
    )
    uvicorn.run(
        create_app(fake),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
