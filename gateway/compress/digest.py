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

Supersession: a statement "subject = value" (is / : / = / set ... to / 是 / は
...) retires every earlier sentence that states the same subject, and every
earlier sentence that mentions the value it replaced, so a corrected value
never survives beside the old one.

Cache stability: the digest depends only on the span and its token cap, so a
span that stays dropped yields the same bytes on every request.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.compress.transforms import TOOL_ANSWER_ROLES, call_request, error_lines
from gateway.compress.units import is_user_input
from gateway.tokens.formats import compact_json

Message = Mapping[str, Any]

SECTIONS = ("The user said:", "Facts and decisions:", "Tool calls:")
ITEM_CHARS = 320  # a longer sentence is cut in the middle: one pasted paragraph must not fill the digest
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


def digest_lines(messages: Sequence[Message]) -> list[tuple[int, int, str]]:
    """(section, rank, text) of every candidate, in span order, superseded facts already removed."""
    items: list[_Item] = []
    calls: dict[str, int] = {}
    order = 0
    for message in messages:
        role = message.get("role")
        user = is_user_input(message)
        for text in _texts(message):
            lines = _sentences(text)
            tool_output = role in TOOL_ANSWER_ROLES or (not user and role == "user")
            kept = 0
            for line in lines:
                order += 1
                lower = line.lower()
                if user:
                    if _cued(lower, _CUE_WORDS, _CUE_PHRASES):
                        items.append(_Item(0, 0, order, line))
                    elif _FACT.search(line):
                        items.append(_Item(0, 1, order, line))
                    else:
                        items.append(_Item(0, 4 if len(line) <= SHORT_USER_CHARS else 5, order, line))
                    continue
                if tool_output and kept >= TOOL_LINES:
                    continue
                if _cued(lower, _ERROR_WORDS, _ERROR_PHRASES) or _cued(
                    lower, _DECISION_WORDS, _DECISION_PHRASES
                ):
                    items.append(_Item(1, 2 if tool_output else 1, order, line))
                    kept += 1
                elif _FACT.search(line):
                    items.append(_Item(1, 4 if tool_output else 3, order, line))
                    kept += 1
            if tool_output:
                # A failure is usually reported last, after the lines the cap above stopped at.
                taken = {item.text for item in items[-kept:]} if kept else set()
                for line in error_lines(text):
                    if line not in taken:
                        order += 1
                        items.append(_Item(1, TOOL_ERROR_RANK, order, line))
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
    return text if len(text) <= ARG_CHARS else text[: ARG_CHARS - 1] + "…"


def _clip(text: str) -> str:
    text = " ".join(text.split())
    if len(text) <= ITEM_CHARS:
        return text
    half = (ITEM_CHARS - 1) // 2
    return text[:half] + "…" + text[-half:]


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
    assignments = [(_assignment(item.text) if item.section < 2 else None) for item in items]
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
