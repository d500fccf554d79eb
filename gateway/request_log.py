"""One log line per request, and the log format of the whole process (``server.log_format``).

A request's line says what happened to it — route, status, model, tokens before and after,
compression stages, overflow retry, upstream attempts, durations — and never what it said:
no prompt or answer content, no header value but the request id, no key. ``json`` writes one
JSON object a line (every other log record too) for log pipelines; ``text`` writes the same
fields as ``key=value`` for people.
"""

from __future__ import annotations

import logging
import logging.config
import time
from dataclasses import dataclass, field
from typing import Any

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
        for name in ("model", "team", "stream", "tokens_before", "tokens_after", "overflow_retry"):
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


def log_request(record: RequestRecord) -> None:
    if log.isEnabledFor(logging.INFO):
        log.info("request", extra={"request": record.fields()})


class JsonFormatter(logging.Formatter):
    """One JSON object per record; a request record's fields sit at the top level."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            # Which worker process: requests of one client spread over several.
            "pid": record.process,
        }
        request = getattr(record, "request", None)
        if isinstance(request, dict):
            entry.update(request)
        else:
            entry["message"] = record.getMessage()
        if record.exc_info and record.exc_info[0] is not None:
            # The exception's type only: a traceback can quote request data.
            entry["exception"] = record.exc_info[0].__name__
        return orjson.dumps(entry).decode()


class TextFormatter(logging.Formatter):
    """``time level logger: message``; a request record's fields as ``key=value``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        request = getattr(record, "request", None)
        if isinstance(request, dict):
            record.message = " ".join(f"{k}={_text(v)}" for k, v in request.items())
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return f"({ei[0].__name__})"


def _text(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value).lower() if isinstance(value, bool) else str(value)


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
