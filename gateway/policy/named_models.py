"""The models a pass-through request body names, for a team's model allow-list.

A team held to an allow-list must not reach another model through any route: embeddings and
moderations name it in a JSON body (eval runs, graders and each request of an Anthropic Message
Batch deeper in it: every `model` key counts), audio transcriptions and image edits in a form
field, and OpenAI's batches in their input file (`purpose=batch`, one request per line: read as
it is uploaded, and again where a batch uses it, gateway.policy.batch_input). A JSON or
urlencoded body is read whole, as the upstream would read it (JSON may open with any amount of
whitespace; a form may repeat a field); a multipart upload is read as it streams on to the
upstream, holding only its small fields and a line of a batch file (FormScan). A body that
claims a JSON or form shape but cannot be read as one is refused: a lenient upstream might
still find a model in it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

import orjson
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header

from gateway.errors import GatewayError
from gateway.log_safety import printable

if TYPE_CHECKING:  # defined for type checkers only
    from python_multipart.multipart import MultipartCallbacks

MULTIPART = "multipart/form-data"
# The parser logs each malformed byte it meets, quoting the client's body: the refusal says enough.
logging.getLogger("python_multipart.multipart").setLevel(logging.ERROR)
# A `model` or `purpose` form field holds a name: anything longer is refused, not cut to fit.
FORM_FIELD_LIMIT = 64 * 1024
# A file part's line held before the form has said purpose=batch (most uploads are audio or
# documents, with no lines at all: they are not held whole).
UNDECLARED_LINE_BYTES = 64 * 1024
# What servers drop from a field's name: array brackets, control characters, spaces.
_NAME_NOISE = re.compile(r"\[[^\]]*\]|[\x00-\x20\x7f]")
# In a header's parameters, outside quoted strings (a filename may hold "; name=").
_QUOTED = re.compile(rb'"(?:[^"\\]|\\.)*"')
_AMBIGUOUS_NAME = re.compile(rb"(^|;)\s*name\*", re.IGNORECASE)
_NAME_PARAMETER = re.compile(rb"(?:^|;)\s*name\s*=", re.IGNORECASE)
_BOUNDARY_PARAMETER = re.compile(rb"(?:^|;)\s*boundary\s*=", re.IGNORECASE)
# A file part read as JSON Lines whatever `purpose` says later (the Node SDK sends it last).
_JSON_FILE_NAMES = (b".jsonl", b".ndjson", b".json")


def models_named(body: bytes, content_type: str) -> list[str]:
    """Every ``model`` the body names (none for a body without one, such as a file upload; ""
    for a stored prompt's, which the body does not name)."""
    media = media_type(content_type)
    if media == MULTIPART:
        raise ValueError("a multipart body is read as it streams: FormScan")
    if media == "application/x-www-form-urlencoded":
        return _urlencoded_models(body)
    if not body.strip():
        return []
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        if "json" in media or body.lstrip()[:1] in (b"{", b"[") or _lenient_json(body):
            raise GatewayError(400, "The request body is not valid JSON.") from None
        return []  # neither JSON nor a form: raw bytes, which name no model
    refuse_duplicate_keys(body)
    return _named(payload, "model")


def _lenient_json(body: bytes) -> bool:
    """Whether a lenient upstream could read the body as JSON where orjson cannot: Python's
    parser (FastAPI servers such as vLLM read any content type with it) takes a byte order mark,
    UTF-16 and UTF-32, NaN and Infinity. Such a body could name a model the list never saw."""
    try:
        json.loads(body)
    except (ValueError, RecursionError):
        return False
    return True


def query_models(query_string: bytes) -> list[str]:
    """The `model` parameters of a query string (OpenAI's Realtime calls name the model there),
    spelled as any server might read one: `;` as a separator, any case, `model[]`, a NUL."""
    return _model_values(query_string.decode("latin-1").replace(";", "&"))


def _model_values(fields: str) -> list[str]:
    """The values of the `model` fields of `name=value&...` text, the name spelled any way."""
    pairs = parse_qsl(fields, keep_blank_values=True)
    return [value for name, value in pairs if field_name(name) == "model"]


def field_name(name: str) -> str:
    """A form or query field's name as the most lenient server reads it: `Model`, `model[]` and
    `model\\0` are all `model` to some."""
    return _NAME_NOISE.sub("", name).lower()


def media_type(content_type: str) -> str:
    return content_type.partition(";")[0].strip().lower()


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


def _urlencoded_models(body: bytes) -> list[str]:
    try:
        return _model_values(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise GatewayError(400, "The form body is not valid UTF-8.") from None


class LineSplitter:
    """The lines of a stream that comes in pieces, one line held at a time, at most
    `max_line_bytes` (`what`, `param`: the file named in the refusal of a longer one)."""

    def __init__(self, max_line_bytes: int, what: str, param: str) -> None:
        self._number = 0  # lines returned so far
        self._pending = bytearray()
        self._max = max_line_bytes
        self._what = what
        self._param = param

    def feed(self, chunk: bytes) -> list[tuple[int, bytes]]:
        """The lines `chunk` completes, each with its number (from 1)."""
        searched = len(self._pending)  # what was left holds no line break: only new bytes are searched
        self._pending += chunk
        lines: list[tuple[int, bytes]] = []
        start = 0
        while (end := self._pending.find(b"\n", max(start, searched))) != -1:
            self._number += 1
            lines.append((self._number, bytes(self._pending[start:end])))
            start = end + 1
        del self._pending[:start]
        if len(self._pending) > self._max:
            raise GatewayError(
                400,
                f"Line {self._number + 1} of {self._what} is longer than {self._max:,} bytes.",
                param=self._param,
            )
        return lines

    def finish(self) -> tuple[int, bytes]:
        """The last line and its number (empty when the stream ended with a line break)."""
        self._number += 1
        last = bytes(self._pending)
        self._pending.clear()
        return self._number, last


class FormScan:
    """A multipart/form-data body read as it streams, for a team's model allow-list: `feed` and
    `finish` answer the first model the body names that `allowed` refuses (a `model` field, or a
    line of a `purpose=batch` file), or None. Only the `model` and `purpose` fields and one line
    of a file are held, whatever the upload's size. The `purpose` field may come after the file,
    so what a file's lines name (and a line that cannot be read) counts once the form says batch;
    before it does, a file is held a short line at a time (audio has no lines). A body that ends
    inside a part, or a part that names itself ambiguously, is refused: the upstream might read
    a model there."""

    def __init__(self, content_type: str, max_line_bytes: int, allowed: Callable[[str], bool]) -> None:
        _, options = parse_options_header(content_type)
        boundary = options.get(b"boundary")
        if len(_BOUNDARY_PARAMETER.findall(_QUOTED.sub(b'""', content_type.encode("latin-1")))) > 1:
            # Parsers differ on which of two boundaries counts: the body would read two ways.
            raise GatewayError(400, "The Content-Type names two multipart boundaries.", param="content-type")
        if not boundary:
            raise GatewayError(400, "A multipart/form-data body needs a boundary in its Content-Type.")
        self._allowed = allowed
        self._max_line = max_line_bytes
        self._parser = MultipartParser(boundary, self._callbacks())
        self._field = bytearray()
        self._value = bytearray()
        self._name: str | None = None  # as field_name reads it
        self._named = False  # the part's Content-Disposition was read
        self._json_file = False  # its filename or Content-Type says JSON
        self._held = bytearray()  # the value of a `model` or `purpose` part
        self._lines: LineSplitter | None = None  # in a `file` part
        self._batch = False
        self._refused: str | None = None  # by a field: counts at once
        self._line_refused: str | None = None  # by a file's line: counts for a batch file
        self._line_error: GatewayError | None = None

    def feed(self, chunk: bytes) -> str | None:
        try:
            self._parser.write(chunk)
        except (MultipartParseError, ValueError):
            raise _malformed() from None
        return self._answer()

    def finish(self) -> str | None:
        try:
            self._parser.finalize()
        except (MultipartParseError, ValueError):
            raise _malformed() from None
        if self._parser.state != MultipartState.END:
            raise _malformed()
        return self._answer()

    def _answer(self) -> str | None:
        if self._refused is not None:
            return self._refused
        if self._batch and self._line_error is not None:
            raise self._line_error
        return self._line_refused if self._batch else None

    def _callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda data, start, end: self._field.extend(data[start:end]),
            "on_header_value": lambda data, start, end: self._value.extend(data[start:end]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }

    def _part_begin(self) -> None:
        self._name = None
        self._named = False
        self._json_file = False
        self._held.clear()
        self._lines = None

    def _header_end(self) -> None:
        field = bytes(self._field).strip().lower()
        if field == b"content-disposition":
            value = bytes(self._value)
            unquoted = _QUOTED.sub(b'""', value)
            parameters = parse_options_header(value)[1]
            name = parameters.get(b"name", b"")
            if (
                self._named
                or _AMBIGUOUS_NAME.search(unquoted)
                or len(_NAME_PARAMETER.findall(unquoted)) > 1
                or b"\\" in name
            ):
                # Parsers differ on these (RFC 2231 `name*=`, a repeated name or header, a quoted
                # escape): one an upstream reads as `model` or `file` would go unchecked here.
                raise GatewayError(
                    400, "A multipart part names itself ambiguously.", param="content-disposition"
                )
            self._named = True
            self._name = field_name(name.decode("latin-1"))
            self._json_file = parameters.get(b"filename", b"").lower().endswith(_JSON_FILE_NAMES)
        elif field == b"content-type":
            self._json_file = self._json_file or b"json" in bytes(self._value).lower()
        self._field.clear()
        self._value.clear()

    def _headers_finished(self) -> None:
        if self._name == "file":
            # Before the form says batch, a file is held a short line at a time, unless it is named
            # as JSON Lines: audio has no lines to hold.
            cap = self._max_line if self._batch or self._json_file else UNDECLARED_LINE_BYTES
            self._lines = LineSplitter(cap, "the batch file", "file")

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._name in ("model", "purpose"):
            self._held += data[start:end]
            if len(self._held) > FORM_FIELD_LIMIT:
                message = f"The form field '{self._name}' is longer than {FORM_FIELD_LIMIT:,} bytes."
                raise GatewayError(400, message, param=self._name)
        elif self._lines is not None:
            try:
                lines = self._lines.feed(data[start:end])
            except GatewayError as too_long:
                if self._batch:
                    raise
                # Not (yet) a batch file (audio, an image): it has no lines to read. Should the
                # form say batch after all, its lines went unread, so it is refused then.
                self._line_error = self._line_error or GatewayError(
                    400,
                    f"{too_long.message[:-1]} before the form said purpose=batch: send `purpose` "
                    "before the file, or name the file .jsonl.",
                    param="file",
                )
                self._lines = None
                return
            self._read_lines(lines)

    def _part_end(self) -> None:
        if self._name == "model":
            model = self._held.decode("utf-8", errors="replace")
            if self._refused is None and not self._allowed(model):
                self._refused = model
        elif self._name == "purpose":
            self._batch |= self._held.strip().lower() == b"batch"
        elif self._lines is not None:
            self._read_lines([self._lines.finish()])

    def _read_lines(self, lines: list[tuple[int, bytes]]) -> None:
        if self._line_refused is not None or self._line_error is not None:
            return  # the first refusal is the answer
        for number, line in lines:
            try:
                models = batch_line_models(line, number, param="file")
            except GatewayError as exc:
                self._line_error = exc
                return
            for model in models:
                if not self._allowed(model):
                    self._line_refused = model
                    return


def _malformed() -> GatewayError:
    return GatewayError(400, "The multipart/form-data body is malformed or incomplete.")
