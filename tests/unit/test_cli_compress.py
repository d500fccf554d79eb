"""`context-gateway compress`: a dry run of what the gateway would send."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import orjson
import pytest

from gateway.cli import main
from gateway.tokens.counter import counter_for
from tests.fakes.validation import alternates, validate_chat_messages


def _agent_body(rounds: int) -> dict[str, object]:
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "Rule: cite file paths."},
        {"role": "user", "content": "Find the bug."},
    ]
    for i in range(rounds):
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"c{i}", "type": "function", "function": {"name": "grep", "arguments": "{}"}}
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"match {i}\n" * 400})
    messages.append({"role": "user", "content": "Which file?"})
    return {"model": "gpt-4o", "messages": messages, "temperature": 0.2}


def test_compress_with_budget_prints_valid_fitted_body(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    request = tmp_path / "request.json"
    request.write_bytes(orjson.dumps(_agent_body(10)))
    assert main(["compress", "--model", "gpt-4o", "--budget", "3000", str(request)]) == 0
    captured = capsysbinary.readouterr()
    body = orjson.loads(captured.out)
    assert body["temperature"] == 0.2 and body["model"] == "gpt-4o"
    assert counter_for("gpt-4o").request(body) <= 3000
    assert validate_chat_messages(body["messages"]) is None
    assert body["messages"][-1] == {"role": "user", "content": "Which file?"}
    report = captured.err.decode()
    assert "budget 3000 tokens" in report and "stages: " in report and "tool_results" in report


def test_compress_with_window_and_bare_list(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    request = tmp_path / "messages.json"
    request.write_text(json.dumps(_agent_body(10)["messages"]))
    assert main(["compress", "--model", "gpt-4o", "--window", "8000", str(request)]) == 0
    captured = capsysbinary.readouterr()
    # An unstated output reserve is capped at a quarter of the window: 8000 - 2000 - 256.
    assert b"budget 5744 tokens" in captured.err
    assert validate_chat_messages(orjson.loads(captured.out)["messages"]) is None


def test_compress_refusal_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    request = tmp_path / "huge.json"
    huge = [{"role": "system", "content": "s " * 3000}, {"role": "user", "content": "u " * 3000}]
    request.write_text(json.dumps(huge))
    assert main(["compress", "--model", "gpt-4o", "--budget", "100", str(request)]) == 1
    assert "cannot fit" in capsys.readouterr().err


def test_compress_an_agent_loop_keeps_the_newest_result(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """The same engine as the route: a request ending on a tool result has its older steps compressed."""
    body = _agent_body(10)
    messages = body["messages"]
    assert isinstance(messages, list)
    body["messages"] = messages[:-1]  # the loop goes on: no new user message, the newest result last
    request = tmp_path / "loop.json"
    request.write_bytes(orjson.dumps(body))
    assert main(["compress", "--model", "gpt-4o", "--budget", "3000", str(request)]) == 0
    sent = orjson.loads(capsysbinary.readouterr().out)["messages"]
    assert validate_chat_messages(sent) is None
    assert sent[:2] == messages[:2] and sent[-2:] == messages[-3:-1]
    assert "omitted" in sent[3]["content"]


def _chat_body(turns: int) -> dict[str, object]:
    messages: list[dict[str, object]] = [{"role": "system", "content": "Be brief."}]
    for turn in range(turns):
        messages += [
            {"role": "user", "content": f"Always tag release R-{turn:03d}. " + "Context. " * 80},
            {"role": "assistant", "content": f"Tagged R-{turn:03d}. " + "Details. " * 80},
        ]
    messages.append({"role": "user", "content": "Which releases are tagged?"})
    return {"model": "gpt-4o", "messages": messages}


def test_compress_shows_the_digest_of_what_it_dropped(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    request = tmp_path / "request.json"
    request.write_bytes(orjson.dumps(_chat_body(30)))
    assert main(["compress", "--model", "gpt-4o", "--budget", "4000", str(request)]) == 0
    captured = capsysbinary.readouterr()
    marker = next(
        m["content"] for m in orjson.loads(captured.out)["messages"] if "what they held" in m["content"]
    )
    assert "The user said:\n- Always tag release R-" in marker
    assert "digest within" in captured.err.decode()


def test_compress_calls_a_summarizer_when_given_its_url(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    from tests.fakes.summarizer import serve_summarizer

    request = tmp_path / "request.json"
    request.write_bytes(orjson.dumps(_chat_body(30)))
    with serve_summarizer() as fake:
        argv = ["compress", "--model", "gpt-4o", "--budget", "4000", "--summarizer-url", fake.base_url]
        assert main([*argv, str(request)]) == 0
    captured = capsysbinary.readouterr()
    marker = next(
        m["content"] for m in orjson.loads(captured.out)["messages"] if "what they held" in m["content"]
    )
    assert fake.calls == 1 and "\nNotes: " in marker and "summary within" in captured.err.decode()
    assert "gave no summary" not in captured.err.decode()


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("notaurl", "must start with http:// or https://"),
        ("ftp://x/v1", "must start with http:// or https://"),
        ("http://:8000/v1", "has no host"),
        ("http://x:99999/v1", "has an invalid port"),
        ("http://x/v1\r\nHost: y", "must not contain control characters"),
    ],
)
def test_compress_refuses_a_summarizer_url_the_config_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, named: str
) -> None:
    request = tmp_path / "request.json"
    request.write_bytes(orjson.dumps(_chat_body(30)))
    argv = ["compress", "--model", "gpt-4o", "--budget", "4000", "--summarizer-url", url, str(request)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"context-gateway: --summarizer-url {named}")
    assert captured.err.count("\n") == 1


def test_compress_says_when_the_summarizer_gave_nothing(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    request = tmp_path / "request.json"
    request.write_bytes(orjson.dumps(_chat_body(30)))
    argv = ["compress", "--model", "gpt-4o", "--budget", "4000", "--summarizer-url", dead, str(request)]
    assert main(argv) == 0  # the digest stands in, as in the gateway
    err = capsysbinary.readouterr().err.decode()
    assert f"summarizer at {dead} gave no summary for 1 of 1 dropped span(s) (unreachable)" in err


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ('[1, "x", null]', "'messages[0]': expected an object"),
        ('{"messages": [{"role": "wizard", "content": "hi"}]}', "messages[0].role"),
    ],
    ids=["not-objects", "unknown-role"],
)
def test_compress_names_what_the_gateway_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, named: str
) -> None:
    """A dry run holds the body to what the route accepts: a clean message, never a traceback,
    and never exit 1, which means "cannot fit"."""
    request = tmp_path / "bad.json"
    request.write_text(content)
    assert main(["compress", "--model", "gpt-4o", "--budget", "100", str(request)]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err


def test_compress_with_merged_markers_keeps_roles_alternating(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    messages: list[dict[str, object]] = [{"role": "system", "content": "Be brief."}]
    for turn in range(30):
        messages += [
            {"role": "user", "content": f"Question {turn}: " + "why so slow? " * 40},
            {"role": "assistant", "content": f"Answer {turn}: " + "a cold cache. " * 40},
        ]
    messages.append({"role": "user", "content": "And now?"})
    request = tmp_path / "request.json"
    request.write_bytes(orjson.dumps({"messages": messages}))
    for markers, alternating in (("separate", False), ("merged", True)):
        assert (
            main(["compress", "--model", "gpt-4o", "--budget", "3000", "--markers", markers, str(request)])
            == 0
        )
        sent = orjson.loads(capsysbinary.readouterr().out)["messages"]
        assert alternates(sent) is alternating and "earlier messages omitted" in json.dumps(sent)
        assert counter_for("gpt-4o").messages(sent) <= 3000
