"""Request log lines: the same fields as JSON or as text, client text kept to one bounded line, written
a loop turn's lines at a time in writes that cannot interleave with another worker's."""

from __future__ import annotations

import asyncio
import json
import logging
import select
import shlex
import sys
import time
from collections.abc import Iterator

import pytest

from gateway.request_log import JsonFormatter, RequestLines, RequestRecord, TextFormatter

CREATED = 1_767_225_600.25  # a fixed moment, so that stamps can be compared


class Recorder:
    """A stand-in stderr that keeps each write apart."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


@pytest.fixture
def stderr() -> Iterator[Recorder]:
    requests = logging.getLogger("gateway.requests")
    level = requests.level
    requests.setLevel(logging.INFO)
    yield Recorder()
    requests.setLevel(level)


def _chat_record() -> RequestRecord:
    request = RequestRecord("req-1", "POST", "chat_completions", status=200, model='evil\n{"forged": 1}')
    request.tokens_before, request.tokens_after, request.compression = 900, 400, ("tool_results", "truncate")
    request.overflow_retry, request.upstream_attempts, request.upstream_seconds = False, 2, 0.25
    request.overhead_seconds = 0.0012
    return request


def _plain(name: str, message: str) -> logging.LogRecord:
    record = logging.LogRecord(name, logging.INFO, __file__, 1, message, None, None)
    record.created, record.msecs = CREATED, 250.0
    return record


def test_json_line_carries_the_request_fields() -> None:
    line = RequestLines("json").render(_chat_record().fields(), CREATED)
    assert line.endswith("\n") and line.count("\n") == 1
    entry = json.loads(line)
    assert entry["request_id"] == "req-1" and entry["status"] == 200 and entry["route"] == "chat_completions"
    assert entry["compression"] == ["tool_results", "truncate"]
    assert entry["upstream_attempts"] == 2 and entry["upstream_ms"] == 250.0 and entry["overhead_ms"] == 1.2
    assert entry["model"] == 'evil\\n{"forged": 1}'  # escaped: cannot forge a second line
    assert "merged_markers_retry" not in entry  # said only when it happened
    retried = _chat_record()
    retried.merged_markers_retry = True
    assert json.loads(RequestLines("json").render(retried.fields(), CREATED))["merged_markers_retry"] is True
    # The same head as every other JSON line of the process.
    other = json.loads(JsonFormatter().format(_plain("gateway.requests", "x")))
    assert {k: entry[k] for k in ("time", "level", "logger", "pid")} == {
        k: other[k] for k in ("time", "level", "logger", "pid")
    }


@pytest.fixture
def new_york(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("new_york")
def test_json_time_is_utc_and_text_time_local_whatever_the_machine_zone() -> None:
    """The JSON `time` ends in `Z`: a log pipeline reads it as UTC. It was local time, five hours
    off on a machine in New York."""
    entry = json.loads(RequestLines("json").render(_chat_record().fields(), CREATED))
    assert entry["time"] == "2026-01-01T00:00:00.250Z"  # CREATED is midnight UTC
    assert json.loads(JsonFormatter().format(_plain("gateway", "x")))["time"] == entry["time"]
    text = RequestLines("text").render(_chat_record().fields(), CREATED)
    assert text.startswith("2025-12-31 19:00:00,250 ")  # as logging's own asctime: local


def test_text_line_is_key_value_on_one_line_laid_out_as_every_line() -> None:
    line = RequestLines("text").render(_chat_record().fields(), CREATED)
    assert line.endswith("\n") and line.count("\n") == 1
    assert "request_id=req-1" in line and "status=200" in line and "compression=tool_results,truncate" in line
    assert "overflow_retry=false" in line
    pairs = line.split(": ", 1)[1].rstrip("\n")
    assert line == TextFormatter().format(_plain("gateway.requests", pairs)) + "\n"


def test_a_client_chosen_value_cannot_forge_text_fields() -> None:
    """The request id and the model name are the client's: a space or `=` in one stays inside it."""
    record = RequestRecord(
        "abc team=finance", "POST", "chat_completions", status=200, model='gpt-4o route="admin"'
    )
    line = RequestLines("text").render(record.fields(), CREATED)
    assert 'request_id="abc team=finance"' in line
    assert 'model="gpt-4o route=\\"admin\\""' in line
    fields = dict(pair.split("=", 1) for pair in shlex.split(line.split(": ", 1)[1]))
    assert fields["request_id"] == "abc team=finance" and fields["model"] == 'gpt-4o route="admin"'
    assert fields["route"] == "chat_completions" and "team" not in fields


def test_plain_records_and_exceptions_stay_one_line_without_tracebacks() -> None:
    try:
        raise ValueError("secret payload")
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("gateway", logging.ERROR, __file__, 1, "failed %s", ("x",), exc_info)
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "failed x" and entry["exception"] == "ValueError"
    assert "secret payload" not in json.dumps(entry)
    text = TextFormatter().format(record)
    assert "secret payload" not in text and "(ValueError)" in text


def test_fields_of_a_non_chat_request_leave_chat_fields_out() -> None:
    fields = RequestRecord("req-2", "GET", "passthrough", status=404).fields()
    assert set(fields) == {"request_id", "method", "route", "status", "duration_ms"}


async def test_the_lines_of_a_loop_turn_are_written_together_after_it(stderr: Recorder) -> None:
    lines = RequestLines("text", stderr)
    for n in range(3):
        lines.write(RequestRecord(f"req-{n}", "POST", "chat_completions", status=200))
    assert stderr.writes == []
    await asyncio.sleep(0)
    assert len(stderr.writes) == 1
    assert [line.split()[4] for line in stderr.writes[0].splitlines()] == [
        "request_id=req-0",
        "request_id=req-1",
        "request_id=req-2",
    ]


def test_writes_stay_within_pipe_buf_and_end_on_whole_lines(stderr: Recorder) -> None:
    # A write to a pipe of at most PIPE_BUF bytes is atomic: workers sharing stderr cannot cut into
    # each other's lines. Multi-byte text counts in bytes.
    lines = RequestLines("json", stderr)
    for n in range(40):
        record = RequestRecord(
            f"req-{n}", "POST", "chat_completions", status=200, model="modèle-" + "é" * 150
        )
        lines.write(record)  # no running loop: written at once
    lines.flush()
    assert len(stderr.writes) == 40
    many = RequestLines("json", stderr)
    many._pending = [line for write in stderr.writes for line in write.splitlines(keepends=True)]
    stderr.writes.clear()
    many.flush()
    assert 1 < len(stderr.writes) < 40
    assert all(len(write.encode()) <= select.PIPE_BUF and write.endswith("\n") for write in stderr.writes)
    assert [json.loads(line)["request_id"] for write in stderr.writes for line in write.splitlines()] == [
        f"req-{n}" for n in range(40)
    ]


def test_nothing_is_written_below_the_request_loggers_level(stderr: Recorder) -> None:
    logging.getLogger("gateway.requests").setLevel(logging.WARNING)
    RequestLines("text", stderr).write(RequestRecord("req-1", "POST", "chat_completions", status=200))
    assert stderr.writes == []
