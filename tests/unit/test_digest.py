"""The extractive digest: what it keeps, that it fits, and that fit() puts it (or a summary) in the marker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gateway  # noqa: F401
from gateway.compress import CompressionOptions, fit
from gateway.compress.digest import digest
from gateway.compress.fit import span_key, with_summaries
from gateway.settings import ConfigError, load_settings
from gateway.tokens.counter import counter_for
from tests.fakes.validation import validate_chat_messages

MODEL = "gpt-4o"
COUNT = counter_for(MODEL).text


def call(name: str, **arguments: Any) -> dict[str, Any]:
    import json

    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"c_{name}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


SPAN: list[dict[str, Any]] = [
    {
        "role": "user",
        "content": "Never touch the billing module. Answer in French please. The deadline is Friday.",
    },
    {"role": "assistant", "content": "Understood. I looked around and the config lives in config/app.yaml."},
    {**call("read_file", path="src/server.py")},
    {
        "role": "tool",
        "tool_call_id": "c_read_file",
        "content": "import os\n" * 50 + "Traceback: KeyError: 'DATABASE_URL'\n" + "pass\n" * 50,
    },
    {"role": "assistant", "content": "We decided to use PostgreSQL 16 and the fix is to set DATABASE_URL."},
    {"role": "user", "content": "Actually, the deadline is Monday."},
    {"role": "user", "content": "数据库密码必须保存在 vault 中。回答要简短。"},
]


def test_the_users_rules_come_first_verbatim_then_facts_then_tool_calls() -> None:
    text = digest(SPAN, 400, COUNT)
    rules, facts, calls = (
        text.index("The user said:"),
        text.index("Facts and decisions:"),
        text.index("Tool calls:"),
    )
    assert rules < facts < calls
    for said in (
        "Never touch the billing module.",
        "Answer in French please.",
        "数据库密码必须保存在 vault 中。",
    ):
        assert said in text[rules:facts]
    assert "config/app.yaml" in text and "KeyError: 'DATABASE_URL'" in text and "PostgreSQL 16" in text
    assert "read_file(path=src/server.py)" in text[calls:]
    assert "import os" not in text  # tool output lines without facts are not kept


def test_a_corrected_value_replaces_the_old_one() -> None:
    text = digest(SPAN, 400, COUNT)
    assert "Monday" in text and "Friday" not in text
    span = [
        {"role": "user", "content": "Use port 8080 for the API. The port is 8080."},
        {"role": "assistant", "content": "Starting the server on port 8080 with workers=4."},
        {"role": "user", "content": "Correction: the port is 9091."},
    ]
    text = digest(span, 400, COUNT)
    assert "9091" in text and "8080" not in text


def test_cjk_without_spaces_is_split_into_sentences_and_corrected() -> None:
    span = [
        {"role": "user", "content": "截止日期是周五。不要修改计费模块。" + "这是一段很长的背景介绍" * 40},
        {"role": "assistant", "content": "好的，我会查看 src/main.go 文件。"},
        {"role": "user", "content": "截止日期是周一。"},
    ]
    text = digest(span, 200, COUNT)
    assert "不要修改计费模块。" in text and "截止日期是周一。" in text and "周五" not in text
    assert "src/main.go" in text
    assert COUNT(text) <= 200


def test_the_last_errors_of_a_long_tool_output_are_kept_after_its_first_facts() -> None:
    # A build log: many lines with numbers (facts) first, the failure at its very end, as tools
    # report it; in German, to show the cue list is not the only evidence needed.
    log = "\n".join(f"[{i:04d}] compiled module_{i}.o in {i % 7} ms" for i in range(400))
    log += "\nFehler: Verbindung zu db-17.internal:5432 verweigert (connection refused)\nexit status 2\n"
    span = [
        {"role": "user", "content": "Build the service."},
        call("run", cmd="make"),
        {"role": "tool", "tool_call_id": "c_run", "content": log},
    ]
    text = digest(span, 300, COUNT)
    assert "db-17.internal:5432" in text
    assert "[0000] compiled module_0.o" in text  # the first facts still come too (at most three)
    assert "[0010] compiled" not in text


def test_repeated_tool_calls_are_listed_once_with_their_count() -> None:
    span = [
        call("run_tests", target="tests/unit"),
        call("run_tests", target="tests/unit"),
        call("ls", path="/"),
    ]
    text = digest(span, 200, COUNT)
    assert text.count("run_tests(target=tests/unit)") == 1 and "×2" in text and "ls(path=/)" in text


def test_anthropic_style_blocks_are_read() -> None:
    span = [
        {"role": "user", "content": [{"type": "text", "text": "Always use UTC timestamps."}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "grep", "input": {"pattern": "TODO"}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "error: permission denied on /etc/x"}
            ],
        },
    ]
    text = digest(span, 200, COUNT)
    assert (
        "Always use UTC timestamps." in text and "grep(pattern=TODO)" in text and "permission denied" in text
    )


def test_nothing_fits_a_tiny_room() -> None:
    assert digest(SPAN, 3, COUNT) == ""
    assert digest([], 100, COUNT) == ""


sentences = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=120
)
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool"]), "content": sentences}),
    max_size=12,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages, st.integers(min_value=0, max_value=300))
def test_the_digest_fits_its_room_and_is_deterministic(span: list[dict[str, Any]], room: int) -> None:
    text = digest(span, room, COUNT)
    assert COUNT(text) <= room
    assert digest([dict(m) for m in span], room, COUNT) == text


subjects = st.sampled_from(["port", "deadline", "region", "max retries", "owner", "database host"])
values = st.integers(min_value=100, max_value=99_999).map(lambda n: f"V{n}")
filler = st.lists(st.sampled_from(["Sounds good.", "Let me think about it.", "ok", "继续。"]), max_size=4)


@settings(max_examples=120, deadline=None)
@given(subjects, values, values, filler, filler, st.sampled_from(["user", "assistant"]))
def test_the_newest_value_of_a_fact_is_kept_and_the_stale_one_dropped(
    subject: str, old: str, new: str, before: list[str], between: list[str], role: str
) -> None:
    if old in new:  # equal, or a prefix of it (V137, V1374): its absence cannot be checked
        return
    span = [{"role": "user", "content": text} for text in before]
    span.append({"role": role, "content": f"The {subject} is {old}."})
    span += [{"role": "assistant", "content": text} for text in between]
    span.append({"role": "user", "content": f"Update: the {subject} is now {new}."})
    text = digest(span, 300, COUNT)
    assert new in text and old not in text


def conversation(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Never deploy on Fridays. " + "Background. " * 150},
        {"role": "assistant", "content": "Noted. " + "Detail. " * 150},
    ]
    for turn in range(turns):
        messages += [
            {
                "role": "user",
                "content": f"Step {turn}: the build id is B{turn:04d}. " + "More context here. " * 40,
            },
            {"role": "assistant", "content": f"Done with step {turn}. " + "Explanation goes on. " * 40},
        ]
    return messages


def digest_marker(messages: list[Any]) -> dict[str, Any]:
    return next(
        m for m in messages if "omitted to fit the context window; what they held" in str(m["content"])
    )


def test_fit_puts_the_digest_in_the_marker_and_reports_it() -> None:
    messages = [*conversation(40), {"role": "user", "content": "What is the latest build id?"}]
    result = fit(messages, model=MODEL, budget_tokens=6_000)
    assert result.stages[-2:] == ("drop_turns", "digest") and result.tokens_after <= 6_000
    assert validate_chat_messages(result.messages) is None
    marker = digest_marker(result.messages)
    assert "The user said:" in marker["content"] and "build id is B" in marker["content"]
    (span,) = result.spans
    assert span.account == "digest" and span.key == span_key(span.messages)
    assert len(span.messages) == result.messages_dropped and COUNT(marker["content"]) <= span.room + 40


def test_the_digest_share_bounds_the_marker_and_zero_turns_it_off() -> None:
    messages = [*conversation(40), {"role": "user", "content": "next?"}]
    off = fit(messages, model=MODEL, budget_tokens=6_000, options=CompressionOptions(digest_ratio=0.0))
    assert "digest" not in off.stages and "what they held" not in str(off.messages)
    on = fit(messages, model=MODEL, budget_tokens=6_000)
    marker = digest_marker(on.messages)
    assert COUNT(marker["content"]) <= 6_000 * 0.1 + 40


def test_a_given_summary_replaces_the_digest_for_that_exact_span() -> None:
    messages = [*conversation(40), {"role": "user", "content": "next?"}]
    plain = fit(messages, model=MODEL, budget_tokens=6_000)
    (span,) = plain.spans
    summary = "Rules: never deploy on Fridays. Latest build: B0020."
    summarized = fit(messages, model=MODEL, budget_tokens=6_000, summaries={span.key: summary})
    assert summarized.stages[-2:] == ("drop_turns", "summary")
    assert summary in digest_marker(summarized.messages)["content"]
    # Everything else is the same: where to cut does not depend on the summaries.
    assert len(summarized.messages) == len(plain.messages) and summarized.spans[0].key == span.key
    # A summary of another span, or one too big for the room, is not used.
    other = fit(messages, model=MODEL, budget_tokens=6_000, summaries={"0" * 32: summary})
    huge = fit(messages, model=MODEL, budget_tokens=6_000, summaries={span.key: "word " * 5_000})
    assert other.messages == plain.messages and huge.messages == plain.messages


def test_swapping_summaries_in_equals_fitting_with_them() -> None:
    messages = [*conversation(40), {"role": "user", "content": "next?"}]
    plain = fit(messages, model=MODEL, budget_tokens=6_000)
    (span,) = plain.spans
    summary = "Rules: never deploy on Fridays. Latest build: B0020."
    swapped = with_summaries(plain, {span.key: summary}, model=MODEL)
    assert swapped == fit(messages, model=MODEL, budget_tokens=6_000, summaries={span.key: summary})
    assert swapped.messages[span.index]["content"].endswith(summary)
    assert with_summaries(plain, {span.key: ""}, model=MODEL) is plain  # a failed span keeps its digest


def test_the_marker_stays_byte_identical_while_the_cut_stays_put() -> None:
    markers = []
    cuts = []
    for turns in range(30, 60):
        result = fit(
            [*conversation(turns), {"role": "user", "content": "next?"}], model=MODEL, budget_tokens=6_000
        )
        markers.append(digest_marker(result.messages)["content"])
        cuts.append(result.messages_dropped)
        if len(cuts) > 1 and cuts[-1] == cuts[-2]:
            assert markers[-1] == markers[-2]
        if len(cuts) > 1 and cuts[-1] != cuts[-2]:
            # The longer span names the shorter one it grew from (a summary can build on it).
            assert result.spans[0].previous == cuts[-2]
    assert len(set(cuts)) > 1  # the cut moved at least once in this run


@pytest.mark.parametrize("value", ["abc", "nan", "-0.1", "1", "1.5", "0.1\x00", "9" * 10_000])
def test_the_digest_option_refuses_hostile_values_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError, match="digest_ratio"):
        load_settings(None, {"GATEWAY_COMPRESSION_DIGEST_RATIO": value})


def test_the_digest_option_is_read_from_yaml(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("compression:\n  digest_ratio: 0.05\n")
    assert load_settings(config, {}).compression.digest_ratio == 0.05
