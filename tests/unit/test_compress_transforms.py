"""Per-message transforms and the text condensers they use."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gateway.compress.condense import _pieces, collapse_repeats, condense, condense_json
from gateway.compress.transforms import (
    ToolResult,
    drop_reasoning,
    map_tool_results,
    omit_media,
    omit_tool_result_media,
    placeholder,
    tool_names,
    trim_tool_text,
    truncate_message,
)


def test_condense_keeps_head_tail_and_informative_middle_lines() -> None:
    lines = [f"2024-05-01 10:00:{i % 60:02d} INFO request served in 12ms" for i in range(2_000)]
    lines[1_000] = "2024-05-01 10:16:40 ERROR payment gateway refused card for order ORD-88213"
    text = "\n".join(lines)
    out = condense(text, 3_000, 4.0, prose=False)
    assert len(out) < 3_600
    assert out.startswith(lines[0]) and out.endswith(lines[-1])
    assert "ORD-88213" in out
    assert "lines (~" in out and "omitted by context-gateway" in out


def test_condensing_again_keeps_text_not_the_first_cut_markers() -> None:
    """An aged step's text is cut again, shorter: the first cut's markers (numbers, unique
    shapes) scored as facts, and the room went to three markers side by side."""
    thought = " ".join(f"Step 0 reads value_0_{n} because the parser drops it." for n in range(40))
    once = condense(thought, 1_000, 4.0, prose=True)
    assert once.count("omitted by context-gateway") >= 2  # the first cut kept some middle facts
    twice = condense(once, 250, 4.0, prose=True)
    assert twice.count("omitted by context-gateway") == 1
    assert twice.startswith("Step 0 reads value_0_0")
    assert twice.endswith("value_0_39 because the parser drops it.")


def test_a_cut_to_a_few_words_keeps_both_ends_around_one_marker() -> None:
    """Under a few markers' room (an aged step's 32 tokens), a cut is the text's opening and
    ending, at spaces, around one short marker, within the limit."""
    thought = (
        "THOUGHT: the index is cast to int64 in PandasMultiIndex. " + "It reads each level. " * 20 + "Done."
    )
    out = condense(thought, 128, 4.0, prose=True)
    assert len(out) <= 128 and out.count("omitted") == 1
    head, tail = out.split(" [… ")
    ending = tail.split("…] ")[1]
    assert thought.startswith(head) and thought[len(head)] == " "  # cut at a space
    assert thought.endswith(ending) and thought[-len(ending) - 1] == " "
    assert condense("ab" * 10, 10, 4.0, prose=True) == "ab" * 10  # never longer than the text


def test_condense_is_token_aware_for_text_without_spaces() -> None:
    text = "这是一个很长的中文句子，没有空格。" * 2_000
    out = condense(text, 600, 1.2, prose=True)
    assert len(out) < 800 and out.startswith("这是") and "omitted" in out


def test_condense_leaves_short_text_alone() -> None:
    assert condense("short", 100, 4.0, prose=True) == "short"


def test_collapse_repeats_folds_runs() -> None:
    assert collapse_repeats("a\nb\nb\nb\nb\nc") == "a\nb\n[previous line repeated 3 more times]\nc"
    assert collapse_repeats("a\nb\nb\nc") == "a\nb\nb\nc"


def test_json_keeps_every_key_and_marks_shortened_arrays() -> None:
    doc = {"status": "ok", "items": [{"id": i, "name": f"item {i}"} for i in range(500)], "total": 500}
    doc["items"][250]["warning"] = "quota exceeded"
    out = condense_json(json.dumps(doc, indent=2), 3_000)
    assert out is not None and len(out) <= 3_000
    parsed = json.loads(out)
    assert parsed["status"] == "ok" and parsed["total"] == 500
    assert any("more items omitted" in str(item) for item in parsed["items"])
    assert {"id": 250, "name": "item 250", "warning": "quota exceeded"} in parsed["items"]
    assert condense_json("not json", 10) is None


def test_json_records_fill_the_room_they_are_given() -> None:
    doc = {"results": [{"id": i, "title": f"record {i}"} for i in range(2_000)], "next": "cursor-9"}
    text = json.dumps(doc, indent=2)
    for max_chars in (4_000, 20_000):
        out = condense_json(text, max_chars)
        assert out is not None and 0.9 * max_chars < len(out) <= max_chars
        kept = [item for item in json.loads(out)["results"] if isinstance(item, dict)]
        assert kept[0]["id"] == 0 and kept[-1]["id"] == 1_999 and json.loads(out)["next"] == "cursor-9"
    assert len(kept) > 300  # 16 records (and the last) whatever the room, before


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=40),  # orjson's ints
    lambda inner: st.lists(inner, max_size=80) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
    max_leaves=300,
)
# Tool answers are mostly a list of records beside a few fields: lists longer than the first
# try's 16 items take the path that fills the room.
RECORDS = st.fixed_dictionaries(
    {
        "id": st.integers(0, 10**9),
        "name": st.text(max_size=30),
        "tags": st.lists(st.text(max_size=8), max_size=4),
    }
)
ANSWERS = st.fixed_dictionaries(
    {"items": st.lists(RECORDS, min_size=17, max_size=200), "next": st.text(max_size=20)}
)


def check_condensed(value: Any, share: float, indent: bool) -> None:
    text = json.dumps(value, indent=2 if indent else None, ensure_ascii=False)  # as long as orjson writes it
    max_chars = max(2, int(share * len(text)))
    out = condense_json(text, max_chars)
    if out is not None:  # None: not a document, or over the limit even at one item per array
        assert len(out) <= max_chars
        parsed = json.loads(out)
        if isinstance(value, dict):
            assert parsed.keys() == value.keys()


@given(JSON_VALUES, st.floats(min_value=0.01, max_value=1.0), st.booleans())
def test_condensed_json_is_json_within_its_limit(value: Any, share: float, indent: bool) -> None:
    check_condensed(value, share, indent)


@given(ANSWERS, st.floats(min_value=0.05, max_value=1.0), st.booleans())
def test_condensed_records_are_json_within_their_limit(value: Any, share: float, indent: bool) -> None:
    check_condensed(value, share, indent)


def test_trim_tool_text_uses_json_when_it_can() -> None:
    text = json.dumps({"rows": list(range(5_000))})
    assert json.loads(trim_tool_text(text, 400, 3.0))["rows"][-1] == 4_999


def test_drop_reasoning_removes_fields_and_blocks_only() -> None:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "answer"}],
        "reasoning_content": "long thoughts",
        "x_extra": 1,
    }
    out = drop_reasoning(message)
    # The text field stays, empty: DeepSeek's thinking mode refuses an assistant message without it.
    answer = [{"type": "text", "text": "answer"}]
    assert out == {"role": "assistant", "content": answer, "reasoning_content": "", "x_extra": 1}
    assert message["reasoning_content"] == "long thoughts"  # not mutated
    only_thinking = {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}
    assert drop_reasoning(only_thinking)["content"][0]["type"] == "text"
    plain = {"role": "assistant", "content": "hi"}
    assert drop_reasoning(plain) is plain


def test_placeholder_names_the_tool_in_both_formats() -> None:
    messages: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "a", "function": {"name": "read_file"}}],
        },
        {"role": "tool", "tool_call_id": "a", "content": "x\n" * 500},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "grep", "input": {}}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "y" * 900}]}
            ],
        },
    ]
    names = tool_names(messages)

    def replace(text: str, result: ToolResult) -> str:
        return placeholder(text, result.name, 4.0, failed=result.failed)

    openai = map_tool_results(messages[1], names, replace)
    assert (
        openai["content"] == "[context-gateway: output of tool `read_file` omitted (501 lines, ~250 tokens)]"
    )
    anthropic = map_tool_results(messages[3], names, replace)
    block = anthropic["content"][0]
    assert block["tool_use_id"] == "t" and "`grep`" in block["content"][0]["text"]
    assert map_tool_results(messages[0], names, replace) is messages[0]


def test_a_placeholder_keeps_the_last_error_lines_of_the_output() -> None:
    output = "ok 1\n" * 3_000 + "ERROR test_login.py::test_expired - AssertionError: 401 != 200\n"
    output += "ok 2\n" * 500 + "连接失败：数据库 DB-7 拒绝连接\n" + "summary: 1 failed, 3500 passed\n"
    line = placeholder(output, "pytest", 4.0)
    assert line.startswith("[context-gateway: output of tool `pytest` omitted (3,504 lines")
    # The last two distinct error lines, oldest first; the earlier one is not there.
    assert line.endswith("; it said: 连接失败：数据库 DB-7 拒绝连接 | summary: 1 failed, 3500 passed]")
    assert "\n" not in line
    one_line = "x" * 100_000 + " fatal: unable to access https://git.example/repo.git " + "y" * 100_000
    clipped = placeholder(one_line, "git", 4.0)
    assert "fatal: unable to access" in clipped and len(clipped) < 300
    assert placeholder("all good\n" * 400, "ls", 4.0).endswith("tokens)]")


# What a model read in place of an output that never failed: "omitted (776 lines); it said: 703→
# <span :if={error.error_content} class="error-content">", and took the Read for a failure.
FILLER = "".join(f"line {n} of the output, nothing to see\n" for n in range(300))
NOT_FAILURES = {
    "numbered read of a template": "".join(f"{n:>6}→   <li>{{item.name}}</li>\n" for n in range(1, 700))
    + '   703→              <span :if={error.error_content} class="error-content">\n'
    + "   704→                {String.slice(error.error_content, 0, 100)}\n"
    + "   705→              </span>\n",
    "numbered read of code": FILLER
    + "    41\t    except ValueError:\n    42\t        raise ConfigError(f'bad value: {value}')\n",
    "a page": FILLER + '<div class="terminal-connecting-title">Subagent not found</div>\n</div>\n',
    "plain code": FILLER
    + "def error_lines(text: str) -> list[str]:\n    except ValueError:\n"
    + "        return handle_error(error_content)\n  error: string;\n  onError: (e: Error) => void;\n",
    "prose about errors": FILLER + "See the guide on error handling and failover for details.\n",
    "imports and comments": FILLER
    + "from django.core.exceptions import FieldError, ValidationError\n"
    + "        # Trigger an AttributeError if this ValidationError\n",
}


def test_a_placeholder_quotes_no_error_from_a_listing_a_page_or_code() -> None:
    for kind, output in NOT_FAILURES.items():
        line = placeholder(output, "Read", 4.0)
        assert line.startswith("[context-gateway: output of tool `Read` omitted"), kind
        assert "it said" not in line and line.endswith("tokens)]"), (kind, line)


FAILURES = {
    "Traceback (most recent call last):\n  File \"a.py\", line 3\nKeyError: 'uid'\n": "KeyError: 'uid'",
    "   Compiling app v0.1.0\nerror[E0308]: mismatched types\n --> src/main.rs:2:18\n": "error[E0308]",
    "src/a.c:3:5: error: expected ';' before 'return'\n": "a.c:3:5: error: expected ';'",
    "bash: crontab: command not found\n": "crontab: command not found",
    "Exit code 2\nmake: leaving directory\n": "Exit code 2",
    "FAILED tests/test_auth.py::test_expired - assert 401 == 200\n== 1 failed, 40 passed ==\n": "1 failed",
    "Error: Cannot find module 'express'\n    at Function.resolve (node:internal)\n": "Cannot find module",
    "--- FAIL: TestParse (0.00s)\npanic: runtime error: index out of range [3]\n": "panic: runtime error",
    "A.java:3: error: incompatible types: List<String> cannot be converted to int\n": "incompatible types",
    "2024-05-01 10:16:40,123 ERROR [main] database db-7 unreachable\n": "db-7 unreachable",
    '{"error": {"code": 401, "message": "invalid token"}}\n': '"error"',
    "npm ERR! code E404\n": "npm ERR! code E404",
    "fatal: not a git repository (or any of the parent directories): .git\n": "fatal: not a git",
    "ls: cannot access 'build': No such file or directory\n": "No such file or directory",
    "连接失败：数据库 DB-7 拒绝连接\n": "连接失败",
}


def test_a_placeholder_quotes_the_failures_of_any_tool_and_language() -> None:
    for output, said in FAILURES.items():
        line = placeholder(FILLER + output, "run", 4.0)
        assert "; it said: " in line and said in line.split("; it said: ")[1], (output, line)


def test_a_result_that_says_it_failed_keeps_its_error_line_whatever_its_shape() -> None:
    """Anthropic's `is_error: true`: the tool itself says the call failed, so its cue lines are
    the failure, even when they read as markup."""
    text = FILLER + "<tool_use_error>String to replace not found in file.</tool_use_error>"
    names = {"t": "Edit"}

    def replace(text: str, result: ToolResult) -> str:
        return placeholder(text, result.name, 4.0, failed=result.failed)

    def result(**flag: Any) -> dict[str, Any]:
        block = {"type": "tool_result", "tool_use_id": "t", "content": text, **flag}
        return {"role": "user", "content": [block]}

    failed = map_tool_results(result(is_error=True), names, replace)["content"][0]["content"]
    assert failed.startswith("[context-gateway: output of tool `Edit` omitted")
    assert failed.endswith("it said: <tool_use_error>String to replace not found in file.</tool_use_error>]")
    for fine in (result(), result(is_error=False)):
        assert map_tool_results(fine, names, replace)["content"][0]["content"].endswith("tokens)]")


def test_an_output_barely_bigger_than_its_placeholder_is_kept() -> None:
    """An 82-character bash output went for an 80-character placeholder that said less."""
    output = "\x1b[?2004lbash: crontab: command not found\nbash: crontab: command not found\n\x1b[?2004h"
    assert placeholder(output, "execute_bash", 1.6) == output
    assert placeholder(output * 3, "execute_bash", 1.6).startswith("[context-gateway: output of tool")


def test_a_json_result_too_big_for_every_cut_that_keeps_its_keys_stays_json() -> None:
    """A customer record whose every key did not fit its cap was cut as text in the middle
    (`"email": [… ~232 tokens omitted …] "certificate_2765295"}}`): the model got no JSON."""
    methods = {
        f"{kind}_{n}": {"source": kind, "amount": 100 + n, "id": f"{kind}_{n}"}
        for n, kind in enumerate(("credit_card", "gift_card", "certificate") * 3)
    }
    record = {
        "name": {"first_name": "Mohamed", "last_name": "Silva"},
        "address": {"address1": "638 Elm Street", "city": "Los Angeles", "zip": "91365"},
        "email": "mohamed.silva9198@example.com",
        "dob": "1960-11-26",
        "payment_methods": methods,
        "membership": "regular",
        "reservations": ["K1NW8N"],
    }
    text = json.dumps(record)
    for cap in (700, 400, 200):
        out = trim_tool_text(text, cap, 2.8)
        assert len(out) < len(text)
        shrunk = json.loads(out)  # still JSON
        assert shrunk["name"] == record["name"]
        assert any("more keys omitted by context-gateway" in str(value) for value in shrunk.values())
    # JSON nested deeper than it can be written back is still cut, as text.
    deep = "[" * 300 + "]" * 300
    assert len(trim_tool_text(deep * 20, 500, 3.0)) < 600


def test_truncate_message_keeps_content_type_and_skips_tool_messages() -> None:
    long = "First sentence. " + "Filler words here. " * 2_000 + "Last sentence."
    as_list = truncate_message({"role": "user", "content": [{"type": "text", "text": long}]}, 800, 4.0)
    assert isinstance(as_list["content"], list) and len(as_list["content"][0]["text"]) < 1_000
    as_str = truncate_message({"role": "assistant", "content": long}, 800, 4.0)
    assert as_str["content"].startswith("First sentence.") and as_str["content"].endswith("Last sentence.")
    tool = {"role": "tool", "tool_call_id": "a", "content": long}
    assert truncate_message(tool, 800, 4.0) is tool


def test_truncate_message_shrinks_long_tool_call_arguments_as_json() -> None:
    arguments = json.dumps({"path": "a.py", "content": "x = 1\n" * 5_000})
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "a", "function": {"name": "write", "arguments": arguments}}],
    }
    out = truncate_message(message, 1_000, 3.0)
    shrunk = json.loads(out["tool_calls"][0]["function"]["arguments"])
    assert shrunk["path"] == "a.py" and len(shrunk["content"]) < 1_000


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def test_omit_media_replaces_every_media_part_by_one_text_line() -> None:
    message: dict[str, Any] = {
        "role": "user",
        "content": [
            {"type": "text", "text": "Here is the screenshot and the report."},
            IMAGE,
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            {
                "type": "file",
                "file": {"filename": "report.pdf", "file_data": "data:application/pdf;base64,AA"},
            },
            {
                "type": "image",
                "source": {"type": "base64", "data": "AAAA"},
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "document", "source": {"type": "text", "data": "..."}, "title": "Q3 notes"},
        ],
        "x_tag": 1,
    }
    original = copy.deepcopy(message)
    out = omit_media(message)
    assert message == original, "input mutated"
    assert out["x_tag"] == 1 and out["content"][0] is message["content"][0]
    assert [part["type"] for part in out["content"]] == ["text"] * 6
    assert [part["text"] for part in out["content"][1:]] == [
        "[image omitted by context-gateway]",
        "[audio omitted by context-gateway]",
        "[file report.pdf omitted by context-gateway]",
        "[image omitted by context-gateway]",
        "[document Q3 notes omitted by context-gateway]",
    ]
    assert out["content"][4]["cache_control"] == {"type": "ephemeral"}  # the client's cache breakpoint stays
    text_only = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    assert omit_media(text_only) is text_only
    plain = {"role": "assistant", "content": "no parts"}
    assert omit_media(plain) is plain


def test_media_inside_tool_results_go_with_tool_results_only() -> None:
    carrier: dict[str, Any] = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "shot"}, IMAGE]},
            IMAGE,  # the user's own image: not a tool result
        ],
    }
    out = omit_tool_result_media(carrier)
    assert out["content"][0]["content"][1] == {"type": "text", "text": "[image omitted by context-gateway]"}
    assert out["content"][1] is IMAGE
    assert omit_media(carrier)["content"][1]["type"] == "text"
    tool = {"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "ok"}, IMAGE]}
    assert omit_tool_result_media(tool)["content"][1]["type"] == "text"
    text_tool = {"role": "tool", "tool_call_id": "a", "content": "ok"}
    assert omit_tool_result_media(text_tool) is text_tool


def test_call_arguments_stay_json_when_even_their_smallest_shrink_is_over_the_cap() -> None:
    """Fuzzed: an argument object with many keys is over a small cap at its smallest shrink that
    keeps every key; it was then cut as text, and the call's `arguments` were no JSON any more.
    Then it was kept at that shrink, over the cap. It keeps its first keys and a count now."""
    arguments = json.dumps({f"field_{n}": f"value {n} " * 8 for n in range(120)})
    call = {"id": "call_1", "type": "function", "function": {"name": "save", "arguments": arguments}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    shrunk = truncate_message(message, 400, 3.5)
    cut = json.loads(shrunk["tool_calls"][0]["function"]["arguments"])  # still JSON
    assert len(shrunk["tool_calls"][0]["function"]["arguments"]) <= 400
    assert "field_0" in cut and cut["…"].startswith(f"{120 - len(cut) + 1} more keys omitted")


def test_a_kept_key_named_like_the_count_keeps_its_value() -> None:
    """The count of left-out keys went under `…`: an object whose own `…` was among the keys kept
    lost that value to the count. The count takes a key no kept key has now."""
    fields = {"…": "the caller's own value", **{f"field_{n}": f"value {n} " * 8 for n in range(120)}}
    call = {"id": "call_1", "type": "function", "function": {"name": "save", "arguments": json.dumps(fields)}}
    shrunk = truncate_message({"role": "assistant", "content": None, "tool_calls": [call]}, 400, 3.5)
    cut = json.loads(shrunk["tool_calls"][0]["function"]["arguments"])
    assert cut["…"] == "the caller's own value"
    assert cut["……"].startswith(f"{121 - len(cut) + 1} more keys omitted")


def test_a_run_of_blank_lines_is_weighed_as_one_piece() -> None:
    """A message of a million empty lines cost a million pieces to weigh, five times over in a
    protected trim: about 2 MB of newlines held a worker for 15-20 s."""
    text = (
        "start of the log\n"
        + "\n" * 100_000
        + " \t\r\n" * 1_000
        + "ERROR: disk full on /dev/sda1\n"
        + "\n" * 100_000
        + "end\n"
    )
    pieces = _pieces(text, prose=False, limit=100)
    assert "".join(pieces) == text
    assert len(pieces) == 5
    out = condense(text, 400, 4.0, prose=False)
    assert out.startswith("start of the log\n") and out.rstrip().endswith("end")
    assert "ERROR: disk full on /dev/sda1" in out and len(out) <= 400
