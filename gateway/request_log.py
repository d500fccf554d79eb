"""One log line per request, and the log format of the whole process (``server.log_format``).

A request's line says what happened to it — route, status, model, tokens before and after,
compression stages, overflow retry, upstream attempts, durations — and never what it said:
no prompt or answer content, no header value but the request id, no key. ``json`` writes one
JSON object a line (every other log record too) for log pipelines; ``text`` writes the same
fields as ``key=value`` for people.

Request lines do not go through `logging`: its record, handler lock and flushed write per line
cost ~15% of a small request's CPU (bench: a gateway at `info` against one at `warning`, both
under wrk). `RequestLines` renders the same line from the record's fields and writes the lines
of one event-loop turn together, in writes of at most `PIPE_BUF` bytes so that lines of several
workers sharing stderr never interleave. The `gateway.requests` logger's level still decides
whether they are written. Every other record goes through `logging` with the formatters below.
"""

from __future__ import annotations

import asyncio
import logging
import logging.config
import os
import re
import select
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import orjson

from gateway.log_safety import printable

REQUEST_LOGGER = "gateway.requests"

log = logging.getLogger(REQUEST_LOGGER)


@dataclass
class RequestRecord:
    """Filled in as a request goes through the gateway; logged once when its answer is complete."""

    request_id: str
    method: str
    route: str
    started: float = field(default_factory=time.perf_counter)
    status: int = 0
    # Chat completions only (None elsewhere).
    model: str | None = None
    team: str | None = None
    stream: bool | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    compression: tuple[str, ...] | None = None
    overflow_retry: bool | None = None
    # True when the upstream's chat template refused the fit's markers and it went again merged.
    merged_markers_retry: bool | None = None
    upstream_attempts: int = 0
    # Seconds until the upstream's response headers, every attempt added up.
    upstream_seconds: float = 0.0
    # Seconds in the gateway before the (first) upstream request was sent.
    overhead_seconds: float | None = None

    def fields(self) -> dict[str, Any]:
        """What the log line carries: set values only, durations in milliseconds."""
        entry: dict[str, Any] = {
            "request_id": self.request_id,
            "method": self.method,
            "route": self.route,
            "status": self.status,
            "duration_ms": round((time.perf_counter() - self.started) * 1000, 2),
        }
        for name in (
            "model",
            "team",
            "stream",
            "tokens_before",
            "tokens_after",
            "overflow_retry",
            "merged_markers_retry",
        ):
            value = getattr(self, name)
            if value is not None:
                entry[name] = printable(value) if isinstance(value, str) else value
        if self.compression is not None:
            entry["compression"] = list(self.compression) or ["none"]
        if self.upstream_attempts:
            entry["upstream_attempts"] = self.upstream_attempts
            entry["upstream_ms"] = round(self.upstream_seconds * 1000, 2)
        if self.overhead_seconds is not None:
            entry["overhead_ms"] = round(self.overhead_seconds * 1000, 2)
        return entry


class Stamps:
    """Times as logging writes them (milliseconds), strftime'd once per second: the text lines
    in local time, as logging's own; the JSON lines' ``time`` in UTC, as its ``Z`` says."""

    def __init__(self) -> None:
        self._second: tuple[int, str, str] = (-1, "", "")  # one tuple: threads may log too

    def text(self, created: float) -> str:
        """``2026-01-02 03:04:05,678``, as logging's ``%(asctime)s``."""
        return f"{self._of(created)[1]},{_millis(created):03d}"

    def iso(self, created: float) -> str:
        """``2026-01-02T03:04:05.678Z``, the JSON lines' ``time``."""
        return f"{self._of(created)[2]}.{_millis(created):03d}Z"

    def _of(self, created: float) -> tuple[int, str, str]:
        cached = self._second
        if cached[0] != int(created):
            local = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(created)))
            utc = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(created)))
            cached = self._second = (int(created), local, utc)
        return cached


def _millis(created: float) -> int:
    return int((created - int(created)) * 1000)  # as LogRecord.msecs


class RequestLines:
    """Each finished request's line on stderr, in `log_format`; see the module docstring."""

    def __init__(self, log_format: str, stream: TextIO | None = None) -> None:
        self.json = log_format == "json"
        self.stream = stream  # None: whatever sys.stderr is when the lines are written
        self.stamps = Stamps()
        self.pid = os.getpid()
        self._pending: list[str] = []

    def write(self, record: RequestRecord) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        self._pending.append(self.render(record.fields(), time.time()))
        if len(self._pending) == 1:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no event loop: nothing to gather the lines of
                self.flush()

    def render(self, fields: dict[str, Any], created: float) -> str:
        if self.json:
            head = {
                "time": self.stamps.iso(created),
                "level": "info",
                "logger": REQUEST_LOGGER,
                "pid": self.pid,
            }
            return orjson.dumps({**head, **fields}).decode() + "\n"
        pairs = " ".join(f"{name}={_text(value)}" for name, value in fields.items())
        return f"{self.stamps.text(created)} INFO {REQUEST_LOGGER}: {pairs}\n"

    def flush(self) -> None:
        lines, self._pending = self._pending, []
        stream = self.stream or sys.stderr
        batch, size = "", 0
        for line in lines:
            length = len(line) if line.isascii() else len(line.encode())
            if batch and size + length > select.PIPE_BUF:
                stream.write(batch)
                stream.flush()
                batch, size = "", 0
            batch, size = batch + line, size + length
        if batch:
            stream.write(batch)
            stream.flush()


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def __init__(self) -> None:
        super().__init__()
        self.stamps = Stamps()

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.stamps.iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            # Which worker process: requests of one client spread over several.
            "pid": record.process,
            "message": record.getMessage(),
        }
        if record.exc_info and record.exc_info[0] is not None:
            # The exception's type only: a traceback can quote request data.
            entry["exception"] = record.exc_info[0].__name__
        return orjson.dumps(entry).decode()


class TextFormatter(logging.Formatter):
    """``time level logger: message``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatException(self, ei: Any) -> str:
        return f"({ei[0].__name__})"


def _text(value: Any) -> str:
    """A value as logfmt writes it: quoted, JSON-escaped, when it could read as more than one field
    (a client chooses its request id and model name: `abc team=finance` must stay one value)."""
    if isinstance(value, list):
        text = ",".join(str(v) for v in value)
    else:
        text = str(value).lower() if isinstance(value, bool) else str(value)
    if not text or _NEEDS_QUOTES.search(text):
        return orjson.dumps(text).decode()
    return text


_NEEDS_QUOTES = re.compile(r'[ ="\\]')  # one scan per field of every request line


def logging_config(log_format: str, level: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for the gateway and uvicorn; each worker process applies it."""
    formatter = JsonFormatter if log_format == "json" else TextFormatter
    handler = {"class": "logging.StreamHandler", "formatter": "gateway", "stream": "ext://sys.stderr"}
    level = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"gateway": {"()": f"{formatter.__module__}.{formatter.__qualname__}"}},
        "handlers": {"stderr": handler},
        "loggers": {
            "gateway": {"handlers": ["stderr"], "level": level, "propagate": False},
            "uvicorn": {"handlers": ["stderr"], "level": level, "propagate": False},
            # Our request lines replace uvicorn's access log.
            "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
        },
    }


def configure_logging(log_format: str, level: str) -> None:
    logging.config.dictConfig(logging_config(log_format, level))
