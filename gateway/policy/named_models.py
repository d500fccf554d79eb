"""The models a pass-through request body names, for a team's model allow-list.

A team held to an allow-list must not reach another model through any route: embeddings and
moderations name it in a JSON body (eval runs, graders and each request of an Anthropic Message
Batch deeper in it: every `model` key counts), audio transcriptions and image edits in a form
field, and OpenAI's batches in their input file (`purpose=batch`, one request per line: read as
it is uploaded, and again where a batch uses it, gateway.policy.batch_input). The whole body
is read as the upstream would read it (JSON may open with any amount of whitespace; a form
may repeat a field), and a body that claims a JSON or form shape but cannot be read as one is
refused: a lenient upstream might still find a model in it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

import orjson
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header

from gateway.errors import GatewayError
from gateway.log_safety import printable

if TYPE_CHECKING:  # defined for type checkers only
    from python_multipart.multipart import MultipartCallbacks

_FORMS = ("multipart/form-data", "application/x-www-form-urlencoded")


def models_named(body: bytes, content_type: str) -> list[str]:
    """Every ``model`` the body names (none for a body without one, such as a file upload; ""
    for a stored prompt's, which the body does not name)."""
    media = content_type.partition(";")[0].strip().lower()
    if media in _FORMS:
        return _form_models(body, content_type, media)
    if not body.strip():
        return []
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        if "json" in media or body.lstrip()[:1] in (b"{", b"["):
            raise GatewayError(400, "The request body is not valid JSON.") from None
        return []  # neither JSON nor a form: raw bytes, which name no model
    refuse_duplicate_keys(body)
    return _named(payload, "model")


def refuse_duplicate_keys(body: bytes) -> None:
    """Refuse a JSON body in which one object names a key twice.

    Parsers disagree about which of two equal keys counts (orjson, as most, keeps the last;
    some keep the first), and what the team's list judges (a model, the input file of a batch,
    the requests of one, an eval's data source) must be what the upstream reads: such a body
    fails closed. Pass-through bodies and batch lines, read whole for their models anyway, are
    read once more with every object's keys seen (~90 µs per 100 KB). The prompt routes are
    not: it would cost as much on the hot path of every request, and the common parsers
    (Python's, Go's, JavaScript's) keep the last key as orjson does.
    """
    try:
        json.loads(body, object_pairs_hook=_keys_once)
    except RecursionError:  # deeper than this parser goes: unchecked, so refused
        raise GatewayError(400, "The request body nests too deeply to check the models it names.") from None
    except ValueError:
        return  # not JSON: the caller's own reading refuses it


def _keys_once(pairs: list[tuple[str, object]]) -> dict[str, object]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            name = printable(key, 64)
            message = f"The request body names '{name}' more than once in one object."
            raise GatewayError(400, message, param=name)
        seen.add(key)
    return dict(pairs)


def _models_in(payload: object, param: str) -> list[str]:
    """Every string under a ``model`` key at any depth, in document order: besides the body's own
    (`param`, which must be a string), each request of a Message Batch names one in its params,
    an eval run in `data_source.model`, a grader in `grader.model`. A `model` that only labels
    data is held to the list too: the check fails closed. Walked with a stack: JSON nests deeper
    than Python recursion goes."""
    if isinstance(payload, dict) and "model" in payload and not isinstance(payload["model"], str):
        raise GatewayError(400, f"'{param}' must be a string.", param=param)
    models: list[str] = []
    stack = [payload]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            model = value.get("model")
            if isinstance(model, str):
                models.append(model)
            children: list[object] = list(value.values())
        elif isinstance(value, list):
            children = value
        else:
            continue
        stack.extend(child for child in reversed(children) if isinstance(child, (dict, list)))
    return models


def _batch_models(lines: bytes) -> list[str]:
    """The models of a batch input file (JSON Lines, each with the request's `body`)."""
    models: list[str] = []
    for number, line in enumerate(lines.splitlines(), start=1):
        models += batch_line_models(line, number, param="file")
    return models


def batch_line_models(line: bytes, number: int, *, param: str) -> list[str]:
    """The model line `number` of a batch input file names (`param`: where the file came from)."""
    if not line.strip():
        return []
    try:
        request = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise GatewayError(400, f"Line {number} of the batch file is not valid JSON.", param=param) from None
    refuse_duplicate_keys(line)
    body = request.get("body") if isinstance(request, dict) else None
    return _named(body, f"{param}: line {number}: body.model") if isinstance(body, dict) else []


def _named(payload: object, param: str) -> list[str]:
    """`_models_in`, and "" for a stored prompt (Responses) that names no model: the model it
    names itself cannot be checked."""
    models = _models_in(payload, param)
    if isinstance(payload, dict) and payload.get("model") is None and isinstance(payload.get("prompt"), dict):
        models.append("")
    return models


def _form_models(body: bytes, content_type: str, media: str) -> list[str]:
    if media == "application/x-www-form-urlencoded":
        try:
            fields = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
        except UnicodeDecodeError:
            raise GatewayError(400, "The form body is not valid UTF-8.") from None
        return [value for name, value in fields if name == "model"]
    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if not boundary:
        raise GatewayError(400, "A multipart/form-data body needs a boundary in its Content-Type.")
    parts = _Parts()
    parser = MultipartParser(boundary, parts.callbacks())
    try:
        parser.write(body)
        parser.finalize()
    except (MultipartParseError, ValueError):
        complete = False
    else:  # a body cut inside a part (a `model` the upstream might read) ends in another state
        complete = parser.state == MultipartState.END
    if not complete:
        raise GatewayError(400, "The multipart/form-data body is malformed or incomplete.")
    models = [value.decode("utf-8", errors="replace") for value in parts.values(b"model")]
    if b"batch" in parts.values(b"purpose"):  # a batch input file: the models its requests run on
        for content in parts.values(b"file"):
            models += _batch_models(content)
    return models


class _Parts:
    """A multipart body's parts by name, as where their bytes lie in it: nothing is copied (an
    upload may be hundreds of megabytes) until a part's value is asked for."""

    def __init__(self) -> None:
        self.spans: dict[bytes, list[list[tuple[bytes, int, int]]]] = {}
        self._field = bytearray()
        self._value = bytearray()
        self._name: bytes | None = None

    def values(self, name: bytes) -> list[bytes]:
        return [b"".join(data[start:end] for data, start, end in part) for part in self.spans.get(name, [])]

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda data, start, end: self._field.extend(data[start:end]),
            "on_header_value": lambda data, start, end: self._value.extend(data[start:end]),
            "on_header_end": self._header_end,
            "on_part_data": self._part_data,
        }

    def _part_begin(self) -> None:
        self._name = None

    def _header_end(self) -> None:
        if bytes(self._field).strip().lower() == b"content-disposition":
            self._name = parse_options_header(bytes(self._value))[1].get(b"name")
            if self._name is not None:
                self.spans.setdefault(self._name, []).append([])
        self._field.clear()
        self._value.clear()

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._name is not None:
            self.spans[self._name][-1].append((data, start, end))
