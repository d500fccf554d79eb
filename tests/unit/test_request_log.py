"""Request log lines: the same fields as JSON or as text, client text kept to one bounded line."""

from __future__ import annotations

import json
import logging

from gateway.request_log import JsonFormatter, RequestRecord, TextFormatter


def _log_record(request: RequestRecord) -> logging.LogRecord:
    record = logging.LogRecord("gateway.requests", logging.INFO, __file__, 1, "request", None, None)
    record.request = request.fields()
    return record


def _chat_record() -> RequestRecord:
    request = RequestRecord("req-1", "POST", "chat_completions", status=200, model='evil\n{"forged": 1}')
    request.tokens_before, request.tokens_after, request.compression = 900, 400, ("tool_results", "truncate")
    request.overflow_retry, request.upstream_attempts, request.upstream_seconds = False, 2, 0.25
    request.overhead_seconds = 0.0012
    return request


def test_json_line_carries_the_request_fields() -> None:
    line = JsonFormatter().format(_log_record(_chat_record()))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["request_id"] == "req-1" and entry["status"] == 200 and entry["route"] == "chat_completions"
    assert entry["compression"] == ["tool_results", "truncate"]
    assert entry["upstream_attempts"] == 2 and entry["upstream_ms"] == 250.0 and entry["overhead_ms"] == 1.2
    assert entry["model"] == 'evil\\n{"forged": 1}'  # escaped: cannot forge a second line
    assert entry["level"] == "info" and entry["logger"] == "gateway.requests" and entry["pid"] > 0


def test_text_line_is_key_value_on_one_line() -> None:
    line = TextFormatter().format(_log_record(_chat_record()))
    assert "\n" not in line
    assert "request_id=req-1" in line and "status=200" in line and "compression=tool_results,truncate" in line
    assert "overflow_retry=false" in line


def test_plain_records_and_exceptions_stay_one_line_without_tracebacks() -> None:
    try:
        raise ValueError("secret payload")
    except ValueError:
        import sys

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
