"""Pure per-message transforms. Each returns the message itself when it has
nothing to change, or a new dict (shallow copy, unknown fields kept) — never
mutates its input. A message's transformed form depends only on that
message and the limits given, so the same old message is compressed the same
way on every request (cache-stable)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson

from gateway.compress.condense import collapse_repeats, condense, condense_json, json_document
from gateway.tokens.formats import compact_json

Message = Mapping[str, Any]


@dataclass(frozen=True)
class ToolResult:
    """What a tool result says of itself besides its text: its tool's name, and whether the call
    failed (Anthropic's `is_error: true` on a `tool_result` block; OpenAI's results say nothing)."""

    name: str
    failed: bool = False


TextFn = Callable[[str, ToolResult], str]  # (text, the result it is in) -> new text

# Reasoning kept as plain text, which a protected message's trim may cut (signed thinking never).
TEXT_REASONING_FIELDS = ("reasoning_content", "reasoning")
REASONING_FIELDS = (*TEXT_REASONING_FIELDS, "reasoning_details", "thinking_blocks")
REASONING_BLOCKS = frozenset({"thinking", "redacted_thinking", "reasoning"})
REASONING_OMITTED = "[reasoning omitted by context-gateway]"
# Content parts that cost tokens without being text (chat, Anthropic and Responses), by what they are.
MEDIA_KINDS = {
    "image_url": "image",
    "image": "image",
    "input_audio": "audio",
    "file": "file",
    "document": "document",
    "input_image": "image",
    "input_file": "file",
}
# A placeholder keeps the output's last error lines: an agent's next move usually answers them,
# and they are what a failed command, request or test said (any language). Found by `rfind` from
# the end, C speed on megabytes of output (a regex for "a line holding a cue" backtracks).
PLACEHOLDER_ERRORS = 2
# An output is replaced only when its placeholder is at most this share of it, saving a third at
# least (a bash output of 82 characters, "command not found" twice, went for an 80-character line).
PLACEHOLDER_MAX_SHARE = 2 / 3
PLACEHOLDER_ERROR_CHARS = 160
CJK_CUES = ("错误", "失败", "異常", "异常", "エラー", "失敗", "오류")
ERROR_CUES = (
    "error", "exception", "traceback", "fail", "fatal", "panic", "denied", "refused", "timed out",
    "not found", "no such file", "exit code", "exit status", "err!", *CJK_CUES,
)  # fmt: skip
# A cue word is only where a line found by it reads as a failure report: a source file, a page or a
# listing holding `error_content` or "Subagent not found" reported nothing (a model reads a
# placeholder quoting them as the call having failed). Looked at on the line around the cue only.
ERROR_WINDOW_CHARS = 400  # each side of the cue
ERROR_LOOKS = 64  # cue lines looked at from the end, at most, before giving up
# A line of a numbered listing (`cat -n`, an editor's read: `  703→ ...`, a grep of source).
_NUMBERED_LINE = re.compile(r"\s*\d+(?:→|\t|\s*\|\s|:\s)")
# Markup: a line opening with a tag, or holding a closing tag or a tag with attributes (a page, a
# template), not a type's parameters (`List<String>` in a compiler's message).
_MARKUP = re.compile(r"^\s*<[A-Za-z!/]|</[A-Za-z][\w.:-]*\s*>|<[A-Za-z][\w.:-]*\s+[\w:@.-]+=")
# Said only by a failure, wherever on the line.
_FAILURE = re.compile(
    r"Traceback \(most recent call last\)|(?i:command not found|no such file or directory"
    r"|permission denied|access denied|segmentation fault|core dumped|connection refused|timed out"
    r"|panicked at|exception in thread|unhandled exception|uncaught \w*(?:error|exception)"
    r"|\bexit(?:ed)?(?: with)? (?:code|status)\s*[:=]?\s*-?[1-9])"
    r"|\b[45]\d\d (?i:not found|forbidden|unauthori[sz]ed|bad request|internal server error"
    r"|service unavailable)"
    r"|:\s*(?i:not found)\s*$"
    # Counts of a test run: `1 failed, 3 passed`, `2 errors`.
    r"|\b[1-9]\d* (?:failed|errors?)\b"
    # A status in capitals (`FAILED tests/x.py::t`, `--- FAIL:`, `[ERROR]`), not a constant's name.
    r"|(?:^|[\s\[|])(?:FAIL(?:ED|URE)?|ERROR|FATAL|CRITICAL|PANIC)(?=[\s:\]|!]|$)(?!\s*=)"
    # A JSON reply's error: `"error": "invalid token"`, `"error": {"code": 401, ...}`.
    r"|\"(?i:error)\"\s*:\s*[\"{\[]"
)
# A label opening the message, at the start or after a prefix (`error:`, `fatal:`, `error[E0308]:`,
# `npm ERR!`, `2024-01-01 12:00 Error: ...`, `a.c:3:5: error: ...`), or an exception's name and
# its message (`KeyError: 'x'`, `E   AssertionError`, `Caused by: a.IOException: x`). Code can
# have that shape (`error: string;`), so not on a line ending as code does.
_LABEL = re.compile(
    r"(?:^|[\s\]|>])(?i:error|err|fatal|panic|failure|failed|exception|critical)(?:\[[\w-]*\])?"
    r"(?::\s+\S|!|\]|\s+\d)"
    r"|(?:^|\s)[\w.$]*[A-Za-z](?:Error|Exception):\s|^\s*(?:E\s+)?[\w.$]*[A-Za-z](?:Error|Exception)\s*$"
)
_CODE_TAIL = (";", "{", ",", "(", "=>")
# Text parts: chat and Anthropic `text`, Responses `input_text` (user side) and `output_text` (model side).
TEXT_KINDS = frozenset({"text", "input_text", "output_text"})
# Messages that are a tool's answer: `role: tool`, and the legacy functions API's `role: function`.
TOOL_ANSWER_ROLES = frozenset({"tool", "function"})
MEDIA_NAME_CHARS = 80  # a file name or document title longer than this is left out of the placeholder


def message_texts(message: Message) -> list[str]:
    """Everything textual in a message: its text, call arguments, tool inputs and reasoning."""
    texts: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, Mapping):
            for key in ("text", "content", "arguments", "function", "custom", "thinking"):
                if key in value:
                    walk(value[key])
            tool_input = value.get("input")
            if isinstance(tool_input, dict | list):  # a tool_use's input: counted as its JSON
                texts.append(compact_json(tool_input))
            elif tool_input is not None:
                walk(tool_input)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(message.get("content"))
    walk(message.get("tool_calls"))
    for key in REASONING_FIELDS:  # counted as tokens too, so part of the density
        walk(message.get(key))
    return texts


def part_lengths(message: Message) -> list[int]:
    """Characters of each part a protected trim cuts on its own: the text, every tool result,
    call's arguments or tool input, and plain-text reasoning."""
    lengths = [len(text) for text in tool_result_texts(message)]
    if message.get("role") in TOOL_ANSWER_ROLES:
        return lengths
    content = message.get("content")
    if isinstance(content, str):
        lengths.append(len(content))
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, Mapping):
                continue
            if part.get("type") in TEXT_KINDS and isinstance(part.get("text"), str):
                lengths.append(len(part["text"]))
            elif part.get("type") == "tool_use" and isinstance(part.get("input"), dict | list):
                lengths.append(len(compact_json(part["input"])))
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        asked = call_request(call)
        if asked is not None and isinstance(asked[1].get(asked[2]), str):
            lengths.append(len(asked[1][asked[2]]))
    for key in TEXT_REASONING_FIELDS:
        if isinstance(value := message.get(key), str):
            lengths.append(len(value))
    return lengths


def text_chars(message: Message) -> int:
    """Characters of everything textual in a message (to derive its chars-per-token ratio)."""
    return sum(map(len, message_texts(message)))


def drop_reasoning(message: Message) -> Message:
    """The assistant message without its reasoning. A text field is emptied, not removed:
    DeepSeek's thinking mode refuses an assistant message of the current turn that lacks
    `reasoning_content` ("Missing `reasoning_content` field in the assistant message"), and an
    empty one costs nothing."""
    if message.get("role") != "assistant":
        return message
    new: dict[str, Any] = {}
    for key, value in message.items():
        if key in TEXT_REASONING_FIELDS and isinstance(value, str):
            new[key] = ""
        elif key not in REASONING_FIELDS:
            new[key] = value
    content = message.get("content")
    if isinstance(content, list):
        kept = [
            part
            for part in content
            if not (isinstance(part, Mapping) and part.get("type") in REASONING_BLOCKS)
        ]
        if len(kept) != len(content):
            # An empty assistant message is rejected by strict APIs; leave a trace instead.
            new["content"] = kept or [{"type": "text", "text": REASONING_OMITTED}]
    return message if new == message else new


def truncate_reasoning(
    message: Message, max_chars: int, chars_per_token: float, *, fill: bool = False
) -> Message:
    """Middle-truncate reasoning kept as plain text (`reasoning_content`, `reasoning`), for a
    protected message that must shrink; signed thinking blocks are never changed."""
    new = dict(message)
    for key in TEXT_REASONING_FIELDS:
        value = message.get(key)
        if isinstance(value, str) and len(value) > max_chars:
            new[key] = condense(value, max_chars, chars_per_token, prose=True, fill=fill)
    return message if new == message else new


def media_placeholder(part: Mapping[str, Any]) -> dict[str, Any]:
    """A text part standing for an image, audio, file or document part (its name kept when short)."""
    kind = MEDIA_KINDS[str(part.get("type"))]
    file = part.get("file")
    name = file.get("filename") if isinstance(file, Mapping) else part.get("title") or part.get("filename")
    label = f"{kind} {name}" if isinstance(name, str) and 0 < len(name) <= MEDIA_NAME_CHARS else kind
    # A Responses input part is replaced by a Responses text part, which is what that API accepts.
    text_kind = "input_text" if part.get("type") in ("input_image", "input_file") else "text"
    new: dict[str, Any] = {"type": text_kind, "text": f"[{label} omitted by context-gateway]"}
    if "cache_control" in part:  # keep the client's prompt-cache breakpoint where it was
        new["cache_control"] = part["cache_control"]
    return new


def _omit_media_parts(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    out = []
    for part in content:
        if isinstance(part, Mapping) and part.get("type") in MEDIA_KINDS:
            part = media_placeholder(part)
        elif isinstance(part, Mapping) and part.get("type") == "tool_result":
            inner = _omit_media_parts(part.get("content"))
            if inner is not part.get("content"):
                part = {**part, "content": inner}
        out.append(part)
    return out if any(a is not b for a, b in zip(out, content, strict=True)) else content


def omit_media(message: Message) -> Message:
    """Replace image, audio, file and document parts (also inside tool results) by a one-line text part.

    Such a part is kept whole or not at all, and costs up to thousands of
    tokens; the text around it is what the conversation refers to later.
    """
    content = _omit_media_parts(message.get("content"))
    return message if content is message.get("content") else {**message, "content": content}


def omit_tool_result_media(message: Message) -> Message:
    """omit_media, but only inside tool results (a `role: tool` message, `tool_result` blocks)."""
    if message.get("role") in TOOL_ANSWER_ROLES:
        return omit_media(message)
    content = message.get("content")
    if not isinstance(content, list):
        return message
    out = []
    for part in content:
        if isinstance(part, Mapping) and part.get("type") == "tool_result":
            inner = _omit_media_parts(part.get("content"))
            if inner is not part.get("content"):
                part = {**part, "content": inner}
        out.append(part)
    changed = any(a is not b for a, b in zip(out, content, strict=True))
    return {**message, "content": out} if changed else message


def _map_text(content: Any, fn: Callable[[str], str]) -> Any:
    """Apply fn to a string content or to each text part of a content list (same type back)."""
    if isinstance(content, str):
        return fn(content)
    if not isinstance(content, list):
        return content
    out = []
    changed = False
    for part in content:
        if isinstance(part, Mapping) and part.get("type") in TEXT_KINDS and isinstance(part.get("text"), str):
            text = fn(part["text"])
            if text != part["text"]:
                part = {**part, "text": text}
                changed = True
        out.append(part)
    return out if changed else content


def call_request(call: Any) -> tuple[str, Mapping[str, Any], str] | None:
    """Where a chat tool call holds its name and what it asked: `function` with JSON
    `arguments`, or, for a custom tool (free-form input, as GPT-5's), `custom` with its `input`
    text. (The key, that object, the field of the request.)"""
    if isinstance(call, Mapping):
        for key, field in (("function", "arguments"), ("custom", "input")):
            if isinstance(value := call.get(key), Mapping):
                return key, value, field
    return None


def tool_names(messages: list[Message]) -> dict[str, str]:
    """Tool call id -> tool name, from OpenAI tool_calls and Anthropic tool_use blocks."""
    names: dict[str, str] = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            asked = call_request(call)
            if asked is not None:
                names[str(call.get("id"))] = str(asked[1].get("name", "tool"))
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and part.get("type") == "tool_use":
                    names[str(part.get("id"))] = str(part.get("name", "tool"))
    return names


def map_tool_results(message: Message, names: Mapping[str, str], fn: TextFn) -> Message:
    """Apply fn to the text of every tool result in a message, in either wire format."""
    role = message.get("role")
    if role in TOOL_ANSWER_ROLES:  # the legacy `function` answer names its function itself
        if role == "tool":
            name = names.get(str(message.get("tool_call_id")), "tool")
        else:
            name = str(message.get("name", "tool"))
        content = _map_text(message.get("content"), partial(_swap, fn, ToolResult(name)))
        return message if content is message.get("content") else {**message, "content": content}
    content = message.get("content")
    if role != "user" or not isinstance(content, list):
        return message
    out = []
    changed = False
    for part in content:
        if isinstance(part, Mapping) and part.get("type") == "tool_result":
            name = names.get(str(part.get("tool_use_id")), "tool")
            result = ToolResult(name, part.get("is_error") is True)
            inner = _map_text(part.get("content"), partial(_swap, fn, result))
            if inner is not part.get("content"):
                part = {**part, "content": inner}
                changed = True
        out.append(part)
    return {**message, "content": out} if changed else message


def tool_result_texts(message: Message) -> list[str]:
    """The texts of every tool result in a message, in either wire format."""
    texts: list[str] = []

    def collect(text: str, _: ToolResult) -> str:
        texts.append(text)
        return text

    map_tool_results(message, {}, collect)
    return texts


def _swap(fn: TextFn, result: ToolResult, text: str) -> str:
    return fn(text, result)


def trim_tool_text(text: str, max_chars: int, chars_per_token: float, *, fill: bool = False) -> str:
    """Tool output shrunk to about max_chars: JSON by structure, anything else by lines.

    JSON stays JSON, never a cut of its text (`"email": [… omitted …] "certificate"}}` parses as
    nothing): where no cut that keeps every key fits, its smallest shrink (its first keys and a
    count of the rest), as call arguments are cut.
    """
    if len(text) <= max_chars:
        return text
    shrunk = condense_json(text, max_chars, or_smallest=True, fill=fill)
    if shrunk is not None:
        return shrunk
    if json_document(text) is not None:
        return text  # no shrink of it is shorter
    folded = collapse_repeats(text)
    return condense(folded, max_chars, chars_per_token, prose=False, fill=fill)


def placeholder(text: str, name: str, chars_per_token: float, *, failed: bool = False) -> str:
    """One line standing for a tool output: its size, and its last error lines when it has any
    (any line with a cue word when the call `failed`, as its result said: `error_lines`)."""
    lines = text.count("\n") + 1
    tokens = round(len(text) / chars_per_token)
    line = f"[context-gateway: output of tool `{name}` omitted ({lines:,} lines, ~{tokens:,} tokens)"
    if len(line) + 1 > len(text) * PLACEHOLDER_MAX_SHARE:
        return text  # it would save too little of the output to lose what it says
    errors = error_lines(text, failed=failed)
    told = f"{line}; it said: {' | '.join(errors)}]"
    # The errors only where they leave the placeholder far smaller than the output: whether an
    # output is replaced at all does not depend on what it says.
    return told if errors and len(told) <= len(text) // 2 else line + "]"


def error_lines(text: str, *, failed: bool = False) -> list[str]:
    """The last `PLACEHOLDER_ERRORS` distinct lines of `text` that report an error, each clipped
    (around the cue when the line is long). Looks at a bounded number of lines from the end.

    A line holding a cue word reports an error when it reads as one (`reports_error`); in the
    output of a call that `failed` (its result said so), any line holding a cue."""
    lowered = text.lower()
    if len(lowered) != len(text):  # a few characters lower to two: positions must match the text
        lowered = text
    last = {cue: lowered.rfind(cue) for cue in ERROR_CUES}  # each cue's last place before `end`
    found: list[str] = []
    half = PLACEHOLDER_ERROR_CHARS // 2
    for _ in range(ERROR_LOOKS):  # repeated lines are looked at, not kept twice
        at = max(last.values())
        if at < 0 or len(found) == PLACEHOLDER_ERRORS:
            break
        start = lowered.rfind("\n", 0, at) + 1
        stop = lowered.find("\n", at)
        stop = len(text) if stop < 0 else stop
        if failed or _reports_error(text, start, stop, at):
            line = " ".join(text[max(start, at - half) : min(stop, at + half)].split())
            if line and line not in found:
                found.insert(0, line)
        for cue, place in last.items():
            if place >= start:
                last[cue] = lowered.rfind(cue, 0, start)
    return found


def _reports_error(text: str, start: int, stop: int, at: int) -> bool:
    """Whether the line text[start:stop], holding a cue at `at`, reads as a failure report rather
    than as code, markup or a listing that merely holds the word. Any language, any tool: a
    traceback, an `error:`/`Error:`/`ERROR` label at the start or after a prefix, an exception's
    name, `command not found`, a non-zero exit code, `FAILED`, a test run's failure count."""
    if _NUMBERED_LINE.match(text, start, stop):
        return False
    window = text[max(start, at - ERROR_WINDOW_CHARS) : min(stop, at + ERROR_WINDOW_CHARS)]
    if _MARKUP.search(window):
        return False
    if any(cue in window for cue in CJK_CUES) or _FAILURE.search(window):
        return True
    return _LABEL.search(window) is not None and not window.rstrip().endswith(_CODE_TAIL)


def truncate_message(
    message: Message, max_chars: int, chars_per_token: float, *, fill: bool = False
) -> Message:
    """Middle-truncate a message's own text (not its tool results), and long tool-call arguments."""
    if message.get("role") in TOOL_ANSWER_ROLES:
        return message
    new = dict(message)

    def prose(text: str) -> str:
        return condense(text, max_chars, chars_per_token, prose=True, fill=fill)

    content = message.get("content")
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "tool_use":
                part = _shrink_tool_input(part, max_chars, fill)
            elif isinstance(part, Mapping) and part.get("type") in TEXT_KINDS:
                part = _map_text([part], prose)[0]
            out.append(part)
        if any(a is not b for a, b in zip(out, content, strict=True)):
            new["content"] = out
    elif isinstance(content, str):
        new["content"] = prose(content)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        new_calls = [_shrink_call(call, max_chars, chars_per_token, fill) for call in calls]
        if any(a is not b for a, b in zip(new_calls, calls, strict=True)):
            new["tool_calls"] = new_calls
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping):  # the legacy functions API: the call's object is the function
        shrunk = _shrink_call({"function": legacy}, max_chars, chars_per_token, fill)
        new["function_call"] = shrunk["function"]
    return message if new == message else new


def _shrink_call(call: Any, max_chars: int, chars_per_token: float, fill: bool) -> Any:
    asked = call_request(call)
    if asked is None:
        return call
    key, request, field = asked
    arguments = request.get(field)
    if not isinstance(arguments, str) or len(arguments) <= max_chars:
        return call
    # Arguments that are JSON stay JSON (a cut in the middle of it fails the providers that
    # parse them, and conversions between wire formats), at their smallest shrink if need be.
    # A custom tool's input is free text (a patch, a query): cut as lines.
    shrunk = None if key == "custom" else condense_json(arguments, max_chars, or_smallest=True, fill=fill)
    if shrunk is None:
        if key != "custom" and _is_json(arguments):
            return call
        shrunk = condense(arguments, max_chars, chars_per_token, prose=False, fill=fill)
    return {**call, key: {**request, field: shrunk}}


def _is_json(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def _shrink_tool_input(part: Mapping[str, Any], max_chars: int, fill: bool) -> Mapping[str, Any]:
    value = part.get("input")
    if not isinstance(value, dict | list):
        return part
    text = compact_json(value)
    if len(text) <= max_chars:
        return part
    shrunk = condense_json(text, max_chars, or_smallest=True, fill=fill)
    return part if shrunk is None else {**part, "input": orjson.loads(shrunk)}
