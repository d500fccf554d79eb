"""The extractive digest of a dropped span: what the dropped turns said that matters later.

When the drop stage removes turns (or old steps of an agent loop), the marker
standing for them carries this digest instead of a bare count. No model is
involved: it is pure, deterministic and linear in the span's size.

Three sections, each printed in the conversation's order:
  The user said       the user's own sentences, verbatim
  Facts and decisions sentences or lines of assistant and tool messages that
                      carry identifiers, numbers, paths, URLs or errors (any
                      script: the evidence is digits, ASCII identifiers and
                      punctuation, not words), or a decision
  Tool calls          by name and their short arguments, repeats counted
A bounded token share is filled by rank, newest first within a rank:
  0 user sentences with an instruction cue (must/never/always/don't, prefer,
    deadlines... in several languages: a bonus layer on the core below)
  1 user sentences carrying a fact; decisions and errors the assistant states
  2 the last error lines of each tool output (found wherever they are, as its
    placeholder finds them), decisions in it; tool calls
  3 other facts the assistant states
  4 facts in tool output; the user's other short sentences (what a user writes
    briefly, in any language, is mostly a request, a rule or a decision)
  5 the user's long sentences

Records stay whole: a JSON text (a document or JSON lines, as search and lookup tools
return them) is read record by record, not as sentences: each record that fits a line is
one candidate, a longer one is split into lines that each name it (its id, else its first
short field) and mark the fields left out with "…"; a long line of records that is not JSON is cut
between them. A line too long for the digest is cut at its end, marked "…". No line joins
text that was not adjacent without saying so: the head of one record is never printed with
the tail of another as if they were one fact.

Supersession: a statement "subject = value" (is / : / = / set ... to / 是 / は
...) retires every earlier sentence that states the same subject, and every
earlier sentence that mentions the value it replaced, so a corrected value
never survives beside the old one.

Cache stability: the digest depends only on the span and its token cap, so a
span that stays dropped yields the same bytes on every request.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.compress.transforms import (
    ERROR_CUES,
    PLACEHOLDER_ERRORS,
    TOOL_ANSWER_ROLES,
    call_request,
    error_lines,
)
from gateway.compress.units import is_user_input
from gateway.tokens.formats import compact_json

Message = Mapping[str, Any]

SECTIONS = ("The user said:", "Facts and decisions:", "Tool calls:")
ITEM_CHARS = 320  # a longer sentence is cut at its end: one pasted paragraph must not fill the digest
LABEL_CHARS = 80  # a record's first scalar field up to this long names it in each of its lines
MAX_DEPTH = 8  # JSON nested deeper is printed as text, cut at its end
SHORT_USER_CHARS = 240  # a user sentence up to this long is a candidate without any cue word
TOOL_LINES = 3  # fact lines kept per tool output at most (logs repeat themselves)
TOOL_ERROR_RANK = 2  # and its last error lines (transforms.error_lines), wherever they are
ARG_CHARS = 60  # tool-call arguments longer than this are elided

# Sentence ends: Latin punctuation before a space, CJK punctuation anywhere, line breaks.
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|(?<=[。！？；])|\n+")


# Language-specific cue words: a bonus layer that ranks instructions above other user sentences.
# Words are matched whole (a set lookup per word), phrases and CJK cues as substrings.
def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?")
_CUE_WORDS = _words(
    "must mustn't never always don't should shouldn't please ensure avoid only prefer "
    "preferably instead deadline due require required forbidden stop keep use answer reply "
    "respond write important remember rule constraint jamais toujours doit doivent réponds "
    "réponde nie niemals immer muss müssen bitte nicht nunca siempre debe deben sempre mai "
    "deve devono никогда всегда должен должны нельзя пожалуйста"
)
_CUE_PHRASES = (
    "do not", "make sure", "no more", "by monday", "by tuesday", "by wednesday", "by thursday",
    "by friday", "by tomorrow", "by eod", "il faut", "ne pas", "s'il te plaît", "s'il vous plaît",
    "por favor", "必须", "务必", "不要", "不能", "不得", "禁止", "别", "总是", "始终", "永远", "一定",
    "请", "截止", "之前", "优先", "必ず", "しないで", "してください", "常に", "絶対", "締め切り",
    "までに", "반드시", "하지 마", "항상", "절대", "마감",
)  # fmt: skip
_DECISION_WORDS = _words(
    "decided decide decision chose chosen agreed settled fixed resolved décidé choisi "
    "entschieden decidido elegido"
)
_DECISION_PHRASES = (
    "we'll use", "we will use", "let's use", "going with", "go with", "switch to", "switched to",
    "the fix", "root cause", "works now", "决定", "采用", "选定", "修复", "決定", "採用", "修正",
)  # fmt: skip
_ERROR_WORDS = _words(
    "error errors exception traceback failed failure fatal panic denied refused errno "
    "segfault timeout erreur fehler"
)
_ERROR_PHRASES = ("not found", "timed out", "错误", "失败", "異常", "エラー", "失敗", "오류")


def _cued(lower: str, words: frozenset[str], phrases: tuple[str, ...]) -> bool:
    return any(phrase in lower for phrase in phrases) or not words.isdisjoint(_WORD.findall(lower))


# Evidence of a fact in any language: a digit, a URL or path, an identifier (snake_case,
# camelCase, ACRONYM) or a file name; a few cheap alternatives, tried at each position.
_FACT = re.compile(
    r"\d|://|\w/\w|[A-Za-z]_[A-Za-z0-9]|[a-z][A-Z]|[A-Z]{2}"
    r"|\w\.(?:py|js|ts|tsx|go|rs|java|rb|c|h|cpp|md|json|ya?ml|toml|txt|sql|sh|html|css|csv|cfg|ini|env|lock)\b"
)
# "subject = value": the subject is what a later statement corrects. Latin copulas take the
# last words before them; `:`/`=` and CJK copulas the text since the previous break.
_VALUE = r"(?P<value>[^\s,;。，；]+(?:\s+[^\s,;。，；]+){0,3}?)(?=$|[\s,;.!?。，；！？)])"
_ASSIGNMENTS = (
    re.compile(
        r"(?:^|[\s,(])(?:set|change|update|switch|move|rename)\s+(?:the\s+)?(?P<subject>[\w\- ]{1,40}?)"
        r"\s+(?:to|=)\s+" + _VALUE,
        re.IGNORECASE,
    ),
    re.compile(
        r"(?P<subject>(?:[\w\-]+\s+){0,2}[\w\-]+)\s+(?:is|are|was|were|should be|will be|is now|"
        r"est|sont|ist|sind|es|son)\s+(?:now\s+|actually\s+|still\s+)?" + _VALUE,
        re.IGNORECASE,
    ),
    re.compile(r"(?P<subject>[^\s:=：,;。，；]{1,40})\s*[:=：]\s*" + _VALUE),
    re.compile(r"(?P<subject>[^\s,;。，；：:是为は]{1,12})(?:改为|改成|应该是|是|为|は)\s*" + _VALUE),
)
_COPULAS = (
    " is ", " are ", " was ", " were ", " be ", " to ", " est ", " sont ", " ist ", " sind ", " es ",
    " son ", ":", "=", "：", "是", "为", "改为", "改成", "は",
)  # fmt: skip
_SUBJECT_NOISE = re.compile(
    r"^(?:the|a|an|our|my|your|its|their|this|that|le|la|les|der|die|das|el|los|las|"
    r"actually|now|so|and|but|also|correction|update|note|ok|okay)\s+",
    re.IGNORECASE,
)
_GENERIC_SUBJECTS = frozenset({"it", "this", "that", "there", "he", "she", "they", "we", "i", "you", "what"})


@dataclass(frozen=True)
class _Item:
    section: int  # index into SECTIONS
    rank: int  # lower is kept first (the module docstring's ranks)
    order: int  # position in the span: output order within a section
    text: str
    statement: bool = True  # False for a data record: it states values, it corrects none


def digest_lines(messages: Sequence[Message]) -> list[tuple[int, int, str]]:
    """(section, rank, text) of every candidate, in span order, superseded facts already removed."""
    items: list[_Item] = []
    calls: dict[str, int] = {}
    order = 0
    for message in messages:
        role = message.get("role")
        user = is_user_input(message)
        for text in _texts(message):
            lines, records = _lines(text)
            tool_output = role in TOOL_ANSWER_ROLES or (not user and role == "user")
            kept = 0
            errors: list[str] = []  # error records of a JSON text, for after the cap
            for line, statement in zip(lines, records, strict=True):
                order += 1
                lower = line.lower()
                if user:
                    if _cued(lower, _CUE_WORDS, _CUE_PHRASES):
                        items.append(_Item(0, 0, order, line, statement))
                    elif _FACT.search(line):
                        items.append(_Item(0, 1, order, line, statement))
                    else:
                        rank = 4 if len(line) <= SHORT_USER_CHARS else 5
                        items.append(_Item(0, rank, order, line, statement))
                    continue
                error = _cued(lower, _ERROR_WORDS, _ERROR_PHRASES)
                if error and not statement:
                    errors.append(line)
                if tool_output and kept >= TOOL_LINES:
                    continue
                if error or _cued(lower, _DECISION_WORDS, _DECISION_PHRASES):
                    items.append(_Item(1, 2 if tool_output else 1, order, line, statement))
                    kept += 1
                elif _FACT.search(line):
                    items.append(_Item(1, 4 if tool_output else 3, order, line, statement))
                    kept += 1
            if tool_output:
                # A failure is usually reported last, after the lines the cap above stopped at.
                taken = {item.text for item in items[-kept:]} if kept else set()
                json_text = bool(lines) and not any(records)
                for line in errors[-PLACEHOLDER_ERRORS:] if json_text else _error_lines(text):
                    if line not in taken:
                        order += 1
                        items.append(_Item(1, TOOL_ERROR_RANK, order, line, not json_text))
        for call in _tool_calls(message):
            order += 1
            calls.setdefault(call, order)
            items.append(_Item(2, 2, calls[call], call))
    items = _supersede(items)
    # Repeated tool calls are listed once, with their count.
    counts: dict[str, int] = {}
    for item in items:
        if item.section == 2:
            counts[item.text] = counts.get(item.text, 0) + 1
    seen: set[tuple[int, str]] = set()
    out: list[tuple[int, int, str]] = []
    for item in items:
        if (item.section, item.text) in seen:
            continue
        seen.add((item.section, item.text))
        text = item.text
        if item.section == 2 and counts[text] > 1:
            text = f"{text} ×{counts[text]}"
        out.append((item.section, item.rank, _clip(text)))
    return out


def digest(messages: Sequence[Message], max_tokens: int, count: Callable[[str], int]) -> str:
    """The digest of `messages` within `max_tokens` (by `count`), or "" when nothing fits.

    Candidates are taken by rank, newest first within a rank (the later
    statement is the one still in force); kept lines are printed by section
    in the span's order. The result is re-counted whole,
    and the least important line dropped until it fits: the cap is a promise.
    """
    candidates = digest_lines(messages)
    headers = [count(header + "\n") for header in SECTIONS]
    ranked = sorted(range(len(candidates)), key=lambda i: (candidates[i][1], -i))
    chosen: list[int] = []
    used = 0
    open_sections: set[int] = set()
    for i in ranked:
        section, _, text = candidates[i]
        cost = count("- " + text + "\n") + (0 if section in open_sections else headers[section])
        if used + cost <= max_tokens:
            chosen.append(i)
            used += cost
            open_sections.add(section)
    while chosen:
        text = _render([candidates[i] for i in sorted(chosen)])
        if count(text) <= max_tokens:
            return text
        chosen.pop()  # the least important of those chosen
    return ""


def _render(lines: Sequence[tuple[int, int, str]]) -> str:
    out: list[str] = []
    for section, header in enumerate(SECTIONS):
        body = [f"- {text}" for s, _, text in lines if s == section]
        if body:
            out.append(header)
            out.extend(body)
    return "\n".join(out)


def _texts(message: Message) -> list[str]:
    """The readable text of a message: its string content or text parts (reasoning left out)."""
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    texts: list[str] = []
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, Mapping):
                continue
            if isinstance(part.get("text"), str) and part.get("type") in (
                "text",
                "input_text",
                "output_text",
            ):
                texts.append(part["text"])
            elif part.get("type") == "tool_result":
                inner = part.get("content")
                if isinstance(inner, str):
                    texts.append(inner)
                elif isinstance(inner, list):
                    texts.extend(
                        p["text"] for p in inner if isinstance(p, Mapping) and isinstance(p.get("text"), str)
                    )
    return texts


def _sentences(text: str) -> list[str]:
    return [s for s in (part.strip(" \t-*•>#") for part in _SENTENCE_END.split(text)) if s]


def _lines(text: str) -> tuple[list[str], list[bool]]:
    """The candidate lines of `text` and whether each is a statement (False: a data record).

    A JSON text is read by records (_json_lines); other text by sentences, one holding several
    records ("}, {" between them, as a JSON list cut short or a repr prints) cut between them,
    so no line runs from one record into the next.
    """
    records = _json_lines(text)
    if records is not None:
        return records, [False] * len(records)
    lines: list[str] = []
    statements: list[bool] = []
    for sentence in _sentences(text):
        pieces = _RECORD_BREAK.split(sentence)
        lines.extend(pieces)
        statements.extend([len(pieces) == 1] * len(pieces))
    return lines, statements


# A field that names its record (id, name, number, code...): the label of its lines if short.
_NAMING_KEY = re.compile(
    r"(?i:(?:^|[_\-\s.])(?:id|name|number|no|key|code|title|ref|sku|uuid)s?)$"
    r"|[a-z](?:Id|Name|Number|Key|Code)s?$"
)

# Between two records on one line: `}, {` (JSON, Python and JS reprs), whatever the spacing.
_RECORD_BREAK = re.compile(r"(?<=\})\s*,\s*(?=\{)")


def _json_lines(text: str) -> list[str] | None:
    """The records of a JSON text (one document, or JSON lines) as digest lines; None if not JSON."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    # json, not orjson: orjson reads an integer past 64 bits as a float, which would print
    # another number than the record holds.
    try:
        values = [json.loads(stripped)]
    except (ValueError, RecursionError):
        values = []
        for line in stripped.splitlines():
            line = line.strip()
            if not line:
                continue
            if line[0] not in "[{":
                return None
            try:
                values.append(json.loads(line))
            except (ValueError, RecursionError):
                return None
    out: list[str] = []
    for value in values:
        _records(value, "", out)
    return out


def _records(value: Any, context: str, out: list[str], depth: int = 0) -> None:
    """Append to `out` the lines of `value`: whole if it fits a line, else by its parts.

    A list is read by its elements (a list of records always, one of long strings if too
    long); a list of numbers or short strings too long is one line cut at its end.
    A dict too long for one line is packed, field by field, into lines that each begin with
    its label (its first short scalar field that names it, like an id, else its first short
    scalar field) and say "…" where fields are left out:
    `{"id":"A1","name":"x",…}`, `{"id":"A1",…,"price":3}`. A field too long for any line is
    read on its own after `{label,…} › key: `, and a long string as sentences, each cut at
    its end. `context` names the enclosing record of a nested part.
    Past MAX_DEPTH levels a part is one line cut at its end (the cost stays linear).
    """
    room = ITEM_CHARS - len(context)
    if depth >= MAX_DEPTH:
        out.append(context + _cut(compact_json(value), room))  # deep JSON: text, not records
        return
    records = isinstance(value, list) and any(isinstance(element, list | dict) for element in value)
    whole = None if records else _compact(value, room)
    if whole is not None:
        out.append(context + whole)
    elif (
        isinstance(value, list)
        and not records
        and all(not isinstance(element, str) or len(element) <= LABEL_CHARS for element in value)
    ):  # numbers, names: one value, cut after an element (not a line for each of 1,536 floats)
        text, _ = _rendered(value, room - 2)
        out.append(context + text[: max(text.rfind(","), 1)] + ",…")
    elif isinstance(value, list):
        for element in value:
            _records(element, context, out, depth + 1)
    elif isinstance(value, dict):
        fields = [(key if isinstance(key, str) else str(key), item) for key, item in value.items()]
        labels = [
            (not _NAMING_KEY.search(key), index, piece[1:-1])
            for index, (key, item) in enumerate(fields)
            if not isinstance(item, list | dict) and (piece := _compact({key: item}, LABEL_CHARS)) is not None
        ]
        _, at, head = min(labels, default=(False, -1, ""))
        chunk: list[tuple[int, str]] = []  # (index, `"key":value`) of the fields of the line packed
        size = len(head) + 8  # the label and the "…" marks
        for index, (key, item) in enumerate(fields):
            piece = _compact({key: item}, room - len(head) - 8)
            if piece is not None and size + len(piece) <= room:
                chunk.append((index, piece[1:-1]))
                size += len(piece)
                continue
            _chunk(chunk, at, head, len(fields), context, out)
            chunk, size = [], len(head) + 8
            if piece is not None:
                chunk.append((index, piece[1:-1]))
                size += len(piece)
                continue
            name = key if len(key) <= LABEL_CHARS else key[: LABEL_CHARS - 1] + "…"
            inner = context + "{" + (head + ",…" if head else "…") + "} › " + name + ": "
            if len(inner) > ITEM_CHARS // 2:  # the outer records' labels go, marked
                inner = "… › " + inner[len(context) :]
            _records(item, inner, out, depth + 1)
        _chunk(chunk, at, head, len(fields), context, out)
    elif isinstance(value, str):
        for sentence in _sentences(value):
            out.append(_clip(context + sentence))
    else:
        out.append(_clip(context + compact_json(value)))


def _chunk(
    chunk: list[tuple[int, str]], at: int, head: str, total: int, context: str, out: list[str]
) -> None:
    """Append the consecutive fields `chunk` of a record of `total` fields as one line: its label
    (field `at`, `head`) first, "…" where fields are left out. The label alone is no line: the
    next line names it anyway."""
    if not chunk or (len(chunk) == 1 and chunk[0][0] == at):
        return
    first, last = chunk[0][0], chunk[-1][0]
    parts: list[str] = []
    if head and not first <= at <= last:
        parts.append(head)
    if first - (at < first) > 0:  # fields before this line's, besides the label
        parts.append("…")
    parts.extend(piece for _, piece in chunk)
    if last < total - 1:
        parts.append("…")
    out.append(context + "{" + ",".join(parts) + "}")


def _compact(value: Any, limit: int) -> str | None:
    """Compact JSON of `value` if it is at most `limit` characters, else None."""
    text, whole = _rendered(value, limit)
    return text if whole else None


def _rendered(value: Any, limit: int) -> tuple[str, bool]:
    """The compact JSON of `value` up to `limit` characters, and whether that is all of it.

    Rendered whole (orjson, in C): _records renders a part at most twice per level of nesting
    above it, and stops at MAX_DEPTH levels, so the digest of a document stays linear in it."""
    text = compact_json(value)
    return (text, True) if len(text) <= limit else (text[:limit], False)


def _error_lines(text: str) -> list[str]:
    """transforms.error_lines, each cut to the record that holds the cue and marked "…" where
    its line goes on: a window of a long line must not read as a whole line or as one record."""
    found = error_lines(text)
    if not found:
        return found
    lines = [" ".join(line.split()) for line in text.splitlines()]
    out: list[str] = []
    for window in found:
        whole = next((line for line in reversed(lines) if window in line), window)
        at = whole.find(window)
        cut_head, cut_tail = at > 0, at + len(window) < len(whole)
        pieces = _RECORD_BREAK.split(window)
        if len(pieces) > 1:  # keep the record that reports the error: a piece after the first
            # begins a record, one before the last ends one
            cued = [i for i, piece in enumerate(pieces) if any(cue in piece.lower() for cue in ERROR_CUES)]
            pick = cued[-1] if cued else len(pieces) - 1
            cut_head = cut_head and pick == 0
            cut_tail = cut_tail and pick == len(pieces) - 1
            window = pieces[pick]
        out.append(("…" if cut_head else "") + window + ("…" if cut_tail else ""))
    return out


def _tool_calls(message: Message) -> list[str]:
    """`name(key=value, ...)` for each tool call (OpenAI tool_calls, Anthropic tool_use blocks)."""
    calls: list[tuple[Any, Any]] = []
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list):
        for call in tool_calls:
            asked = call_request(call)
            if asked is not None:
                key, request, field = asked
                arguments = parsed = request.get(field)
                if key == "function" and isinstance(arguments, str):  # JSON; a custom tool's is text
                    with contextlib.suppress(orjson.JSONDecodeError):
                        parsed = orjson.loads(arguments)
                calls.append((request.get("name"), parsed))
    content = message.get("content")
    if isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "tool_use":
                calls.append((part.get("name"), part.get("input")))
    return [f"{name if isinstance(name, str) else 'tool'}({_arguments(args)})" for name, args in calls]


def _arguments(arguments: Any) -> str:
    if isinstance(arguments, Mapping):
        return ", ".join(f"{key}={_argument(value)}" for key, value in arguments.items())
    return "" if arguments is None else _argument(arguments)


def _argument(value: Any) -> str:
    text = value if isinstance(value, str) else compact_json(value)
    text = " ".join(text.split())
    return _cut(text, ARG_CHARS)


def _clip(text: str) -> str:
    """`text` on one line, cut at its end if too long (_cut).

    Only the end: a head and a tail joined would make one statement of two pieces of text
    that were not adjacent (the head of one record with the tail of another)."""
    return _cut(" ".join(text.split()), ITEM_CHARS)


def _cut(text: str, limit: int) -> str:
    """`text` if at most `limit` characters, else its head marked "…", cut at a space if one is
    in the last quarter, and never inside a number (`114` cut to `11…` would be another price)."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space >= limit * 3 // 4:
        cut = cut[:space]
    while cut and cut[-1] in _NUMBER_CHARS and text[len(cut)] in _NUMBER_CHARS:
        cut = cut[:-1]
    return cut.rstrip() + "…"


_NUMBER_CHARS = frozenset("0123456789.")


def _assignment(line: str) -> tuple[str, str] | None:
    """(subject, value) of the last statement of a value in the line, normalized; None if none."""
    lower = line.lower()
    if not any(copula in lower for copula in _COPULAS):  # most lines state no value: skip the regexes
        return None
    for pattern in _ASSIGNMENTS:
        matches = list(pattern.finditer(line))
        for match in reversed(matches):
            subject = match.group("subject").strip().lower()
            while True:
                stripped = _SUBJECT_NOISE.sub("", subject)
                if stripped == subject:
                    break
                subject = stripped
            value = match.group("value").strip().rstrip(".!?:)'\"")
            if subject and subject not in _GENERIC_SUBJECTS and _valued(value) and not subject.isdigit():
                return subject, value
    return None


def _supersede(items: list[_Item]) -> list[_Item]:
    """Drop what a later statement of the same subject corrected, and any earlier mention of the old value."""
    # A data record states values without correcting anything: the next record of a list
    # naming the same field with another value is another record, not a correction.
    assignments = [
        (_assignment(item.text) if item.section < 2 and item.statement else None) for item in items
    ]
    # Subjects compare case-insensitively, values too; the stale value keeps its case to judge it.
    latest: dict[str, int] = {}
    for index, found in enumerate(assignments):
        if found:
            latest[found[0]] = index
    retired: set[int] = set()
    stale: list[tuple[str, int]] = []  # (old value, index of the statement that replaced it)
    for index, found in enumerate(assignments):
        if found and latest[found[0]] != index:
            newer = assignments[latest[found[0]]]
            if newer is not None and newer[1].lower() != found[1].lower():
                retired.add(index)
                token = next((t for t in found[1].split() if _distinctive(t)), None)
                if token is not None and token.lower() not in newer[1].lower():
                    stale.append((token, latest[found[0]]))
    for value, until in stale:
        pattern = re.compile(r"(?<![\w.])" + re.escape(value) + r"(?![\w])", re.IGNORECASE)
        for index in range(until):
            if items[index].section < 2 and pattern.search(items[index].text):
                retired.add(index)
    return [item for index, item in enumerate(items) if index not in retired]


def _valued(value: str) -> bool:
    """A value, not the start of a clause: a digit, capital, symbol, non-Latin script or rare word."""
    first = value.split()[0] if value.split() else ""
    return _distinctive(first) or (len(first) >= 3 and first.lower() not in _FILLER)


def _distinctive(token: str) -> bool:
    """A token worth hunting in other sentences: it names something (not a common lowercase word)."""
    return any(not ch.isascii() or ch.isdigit() or ch.isupper() or ch in "./_-@:#" for ch in token)


_FILLER = _words(
    "the and not but also very really just going being been done that this there what which "
    "when where who how why then than because probably maybe still already always never here "
    "fine good great correct wrong true false possible important necessary able about for "
    "with from into"
)
