"""Shrink one text to about a size, keeping its head, its tail and its informative middle.

Pure text functions, no token counting: sizes are in characters, the caller
converts its token budget with the message's own characters-per-token ratio
(exact for that message, so this works for Chinese as well as English) and
counts only the result. Never tokenising the omitted part is what keeps
compression cheap on huge conversations.

Pieces are lines (tool output) or sentences (prose); long ones are cut
further, so text without line breaks still shrinks. Between the head and the
tail, pieces that look informative in any language are kept when room
allows: alerts (errors, failures, warnings), identifiers and numbers,
`key: value` lines, and lines whose shape is unique in a repetitive log.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter
from itertools import accumulate, islice
from typing import Any, NamedTuple

import orjson

HEAD_SHARE = 0.35
TAIL_SHARE = 0.25
MARKER_CHARS = 48  # room reserved for the omission marker a kept middle piece may add
CLIP_MARKER_CHARS = 28  # a clip's one marker, spaces around it included
MIN_PART_CHARS = 16  # the least of a piece a filled cut takes in part
MIN_SCORE = 2

# Scanning every line of a megabyte of tool output with regular expressions
# costs more than tokenizing it, so scoring uses only C-speed string methods:
# str.translate, `in`, str.find on the lowered text, and Counter.
ALERTS = (
    "error",
    "exception",
    "fail",
    "fatal",
    "panic",
    "traceback",
    "warn",
    "critical",
    "denied",
    "refused",
    "timeout",
    "timed out",
    "assert",
)
_DIGITS_TO_HASH = str.maketrans("0123456789", "##########")
EDGE_CHARS = 8  # a line whose opening and ending (digits masked) are unique is no template
# Sentence ends: match.end() is where the next sentence starts. The punctuation is
# matched, not looked behind at: the same ends, found a few times faster on long text.
_SENTENCE_END = re.compile(r"[.!?;。！？；]\s+|[。！？；]")


def marker(lines: int, tokens: int) -> str:
    if lines > 0:
        return f"[… {lines:,} lines (~{tokens:,} tokens) omitted by context-gateway …]"
    return f"[… ~{tokens:,} tokens omitted by context-gateway …]"


def _is_marker(piece: str) -> bool:
    """Whether a piece is an omission marker of an earlier condense (its numbers look like facts)."""
    piece = piece.strip()
    return piece.startswith("[… ") and piece.endswith(" omitted by context-gateway …]")


def _split_long(piece: str, limit: int) -> list[str]:
    """Cut a piece longer than `limit` at sentence ends, then spaces, then anywhere."""
    # Walk an offset rather than re-slicing the rest: a megabyte line is copied once, not per cut.
    out: list[str] = []
    start = 0
    while len(piece) - start > limit:
        window = piece[start : start + limit]
        cut = max((m.end() for m in _SENTENCE_END.finditer(window)), default=0)
        if cut < limit // 3:
            cut = window.rfind(" ") + 1
        if cut < limit // 3:
            cut = limit
        out.append(window[:cut])
        start += cut
    if start < len(piece):
        out.append(piece[start:])
    return out


def _pieces(text: str, prose: bool, limit: int) -> list[str]:
    """Split into pieces whose concatenation is `text`. A run of blank lines is one piece: it says
    nothing, and a text of a million empty lines would otherwise cost a million pieces to weigh."""
    lines = text.splitlines(keepends=True)
    pieces: list[str] = []
    blanks: list[str] = []
    for line in lines:
        if line.isspace():
            blanks.append(line)
            continue
        if blanks:
            pieces.append("".join(blanks))
            blanks = []
        if prose and len(line) > limit // 4:
            start = 0
            for cut in [m.end() for m in _SENTENCE_END.finditer(line)] + [len(line)]:
                if cut > start:
                    pieces.extend(_split_long(line[start:cut], limit))
                    start = cut
        elif len(line) > limit:
            pieces.extend(_split_long(line, limit))
        else:
            pieces.append(line)
    if blanks:
        pieces.append("".join(blanks))
    return pieces


def _alert_pieces(pieces: list[str], start: int, stop: int) -> set[int]:
    """Indexes of pieces in [start, stop) that mention an alert word (any case)."""
    offsets = list(accumulate(len(pieces[i]) for i in range(start, stop)))
    lowered = "".join(pieces[start:stop]).lower()
    found: set[int] = set()
    for word in ALERTS:
        position = lowered.find(word)
        while position != -1:
            index = bisect_right(offsets, position)
            found.add(start + index)
            # Skip to the next piece: one hit per piece is enough.
            position = lowered.find(word, offsets[index]) if index < len(offsets) else -1
    return found


def _extend(
    pieces: list[str], head: int, tail: int, kept: set[int], left: int, share: int
) -> tuple[int, int]:
    """The head moved forward over the pieces that fit in `share` of the `left` room; both updated."""
    spent = 0
    while head < tail:
        cost = -MARKER_CHARS if head in kept else len(pieces[head])  # a kept piece is paid for
        if spent + cost > share:
            break
        spent += cost
        kept.discard(head)
        head += 1
    return head, left - spent


def _extend_back(pieces: list[str], head: int, tail: int, kept: set[int], left: int) -> tuple[int, int]:
    """The tail moved back over the pieces that fit in the `left` room; both updated."""
    while tail > head:
        cost = -MARKER_CHARS if tail - 1 in kept else len(pieces[tail - 1])
        if cost > left:
            break
        left -= cost
        kept.discard(tail - 1)
        tail -= 1
    return tail, left


def _select(pieces: list[str], start: int, stop: int, room: int) -> tuple[set[int], int]:
    """The most informative pieces of [start, stop) that fit in `room` characters, and the room
    they leave.

    Informative: alerts, digits (numbers, ids, versions), `key: value` or
    `key = value`, and an opening and ending that no other piece shares. At most one piece
    per digit-masked shape, so a repeated template cannot crowd out a fact.
    """
    alerts = _alert_pieces(pieces, start, stop)
    # One translate of the whole span: per-piece calls cost more than the work.
    masked = "".join(pieces[start:stop]).translate(_DIGITS_TO_HASH)
    ends = list(accumulate(len(pieces[i]) for i in range(start, stop)))
    shapes = [masked[end - len(pieces[start + k]) : end] for k, end in enumerate(ends)]
    openings = Counter(shape.lstrip()[:EDGE_CHARS] for shape in shapes)
    endings = Counter(shape.rstrip()[-EDGE_CHARS:] for shape in shapes)
    candidates: list[tuple[int, int]] = []
    for offset, shape in enumerate(shapes):
        index = start + offset
        piece = pieces[index]
        # How often the line's template (its opening or its ending) recurs.
        common = max(openings[shape.lstrip()[:EDGE_CHARS]], endings[shape.rstrip()[-EDGE_CHARS:]])
        # A warning repeated from one template says less than a line seen once.
        alert = (3 if common <= 2 else 1) if index in alerts else 0
        score = alert + 2 * (shape != piece) + (":" in piece or "=" in piece or "：" in piece)
        if score and common == 1:
            score += 3
        # Text condensed again (a caller cutting a cut text shorter) holds the markers of the first
        # cut: kept, they would fill the room with markers side by side.
        if score >= MIN_SCORE and not _is_marker(piece):
            candidates.append((-score, index))
    candidates.sort()
    kept: set[int] = set()
    seen: set[str] = set()
    for _, index in candidates:
        shape = shapes[index - start].strip()
        cost = len(pieces[index]) + MARKER_CHARS
        if shape not in seen and cost <= room:
            seen.add(shape)
            kept.add(index)
            room -= cost
    return kept, room


def collapse_repeats(text: str, min_run: int = 3) -> str:
    """Fold runs of identical lines into one line and a count (lossless enough, often huge wins)."""
    lines = text.split("\n")
    if not any(a == b == c for a, b, c in zip(lines, lines[1:], lines[2:], strict=False)):
        return text
    out: list[str] = []
    i = 0
    while i < len(lines):
        j = i + 1
        while j < len(lines) and lines[j] == lines[i]:
            j += 1
        out.append(lines[i])
        if j - i >= min_run:
            out.append(f"[previous line repeated {j - i - 1:,} more times]")
        else:
            out.extend(lines[i + 1 : j])
        i = j
    return "\n".join(out)


def condense(text: str, max_chars: int, chars_per_token: float, *, prose: bool, fill: bool = False) -> str:
    """Return `text` shrunk to about `max_chars` characters, with explicit omission markers.

    Text with few informative pieces comes out well under `max_chars` (about 60% for plain
    prose): the head and tail keep their shares and the middle only its facts. With `fill`
    the room left goes on reading from the head, then back from the tail. Only for a message
    that must be kept at a size (a protected one at its floor): for old messages a fuller trim
    only pushes the rest harder (measured: README, fill_quantum's paragraph)."""
    if len(text) <= max_chars:
        return text
    if max_chars < 4 * MARKER_CHARS:
        return _clip(text, max_chars, chars_per_token)
    budget = max_chars
    pieces = _pieces(text, prose, max(64, budget // 6))
    head_room = int(budget * HEAD_SHARE)
    tail_room = int(budget * TAIL_SHARE)

    head = 0
    used = 0
    while head < len(pieces) and used + len(pieces[head]) <= head_room:
        used += len(pieces[head])
        head += 1
    tail = len(pieces)
    used_tail = 0
    while tail > head and used_tail + len(pieces[tail - 1]) <= tail_room:
        used_tail += len(pieces[tail - 1])
        tail -= 1
    room = budget - used - used_tail - MARKER_CHARS

    kept, left = _select(pieces, head, tail, room)
    if fill:
        head_share = int(left * HEAD_SHARE / (HEAD_SHARE + TAIL_SHARE))
        head, left = _extend(pieces, head, tail, kept, left, head_share)
        tail, left = _extend_back(pieces, head, tail, kept, left)
        head, left = _extend(pieces, head, tail, kept, left, left)
        if head < tail and head not in kept and left >= MIN_PART_CHARS:
            # The room left takes the start of the next piece too: a piece of a long line with
            # no break is a sixth of the limit, and whole or nothing it moved a protected
            # message's trim from under its floor to 160 tokens over it.
            piece = pieces[head]
            pieces[head : head + 1] = [piece[:left], piece[left:]]
            kept = {i + 1 if i > head else i for i in kept}
            head, tail = head + 1, tail + 1
    middle = range(head, tail)

    out: list[str] = pieces[:head]
    gap: list[str] = []

    def flush() -> None:
        if gap:
            omitted = "".join(gap)
            newline = "" if not out or out[-1].endswith("\n") else "\n"
            lines = omitted.count("\n")
            tokens = max(1, round(len(omitted) / chars_per_token))
            out.append(f"{newline}{marker(lines, tokens)}\n")
            gap.clear()

    for i in middle:
        if i in kept:
            flush()
            out.append(pieces[i])
        else:
            gap.append(pieces[i])
    flush()
    out.extend(pieces[tail:])
    return "".join(out)


def _clip(text: str, max_chars: int, chars_per_token: float) -> str:
    """`text` cut to a few words: its opening and its ending, at spaces, around one short marker.

    Below a few markers' room, pieces and their markers cost more than the text kept (an aged
    agent step's thought, capped at 32 tokens, came out at 64 with two markers and a fact).
    """
    room = max(0, max_chars - CLIP_MARKER_CHARS)
    head = room * 2 // 3
    space = max(text.rfind(" ", 0, head + 1), text.rfind("\n", 0, head + 1))
    head = space if space > head // 2 else head
    tail = len(text) - (room - head)
    space = min((i for i in (text.find(" ", tail), text.find("\n", tail)) if i != -1), default=-1)
    tail = space + 1 if space != -1 and space + 1 - tail < (room - head) // 2 else tail
    tokens = max(1, round((tail - head) / chars_per_token))
    clipped = f"{text[:head]} [… ~{tokens:,} tokens omitted …] {text[tail:]}"
    return clipped if len(clipped) < len(text) else text


# JSON: keep the structure (every key, but for call arguments that must stay JSON and
# cannot fit otherwise) and shorten long arrays and strings, so the result still reads
# as the same document rather than as broken fragments.


class _Cut(NamedTuple):
    """How far a JSON document is cut: arrays to `items` (with the items that stand out, when
    `salient`), strings to `chars`, and objects, given `keys`, to their first keys and a count."""

    items: int
    chars: int
    salient: bool = True
    keys: int | None = None


_JSON_STEPS = tuple(_Cut(items, chars) for items, chars in ((16, 512), (8, 256), (4, 128), (2, 64), (1, 32)))
# Where JSON must stay JSON and the last step is still too long (arguments of sixty fields, or
# lists whose items all look like errors, kept at 160 characters each): the same without the
# items that stand out, then with fewer and fewer keys.
_JSON_LAST_RESORT = (_Cut(1, 32, salient=False), *(_Cut(1, 32, False, keys) for keys in (16, 8, 4, 2, 1, 0)))
JSON_FILL_ATTEMPTS = 6
OMITTED_KEYS = "…"  # the key that counts an object's keys left out (longer if one is kept)


MAX_SALIENT_ITEMS = 4
SALIENT_CHARS = 160


def _salient(values: list[Any]) -> list[int]:
    """Indexes of array items that stand out: they report a problem, or they are
    objects with a set of keys no sibling has (the exception in a list of records)."""
    shapes = Counter(tuple(v) for v in values if isinstance(v, dict))
    found = []
    for i, value in enumerate(values):
        odd = isinstance(value, dict) and len(shapes) > 1 and shapes[tuple(value)] == 1
        text = "" if odd else orjson.dumps(value).decode().lower()
        if odd or any(word in text for word in ALERTS):
            found.append(i)
            if len(found) == MAX_SALIENT_ITEMS:
                break
    return found


def _shrink(value: Any, cut: _Cut, memo: dict[int, list[int]]) -> Any:
    """`value` cut as `cut` says.

    `memo` keeps each array's salient items across the attempts at smaller sizes.
    """
    if isinstance(value, dict):
        if cut.keys is None or len(value) <= cut.keys + 1:
            return {key: _shrink(item, cut, memo) for key, item in value.items()}
        kept = {key: _shrink(item, cut, memo) for key, item in islice(value.items(), cut.keys)}
        count_key = OMITTED_KEYS
        while count_key in kept:  # a kept key of that very name keeps its value
            count_key += OMITTED_KEYS
        kept[count_key] = f"{len(value) - cut.keys:,} more keys omitted by context-gateway"
        return kept
    if isinstance(value, list):
        if len(value) <= cut.items + 1:
            return [_shrink(item, cut, memo) for item in value]
        keep = set(range(cut.items)) | {len(value) - 1}
        salient: set[int] = set()
        if cut.salient:  # a few items that stand out survive from the middle, their strings less cut
            if id(value) not in memo:
                memo[id(value)] = _salient(value[1:-1])
            salient = {1 + i for i in memo[id(value)] if 1 + i >= cut.items}
        keep |= salient
        out: list[Any] = []
        previous = -1
        standing_out = cut._replace(chars=max(cut.chars, SALIENT_CHARS))
        for i in sorted(keep):  # the kept items only: each attempt costs what it keeps
            if i - previous > 1:
                out.append(f"… {i - previous - 1:,} more items omitted by context-gateway …")
            out.append(_shrink(value[i], standing_out if i in salient else cut, memo))
            previous = i
        return out
    if isinstance(value, str) and len(value) > cut.chars:
        return f"{value[: cut.chars // 2]}… ({len(value):,} chars) …{value[-cut.chars // 4 :]}"
    return value


def json_document(text: str) -> Any:
    """`text` parsed, when it is a JSON object or array that orjson can write back; else None
    (nested deeper than orjson writes, 254 levels, JSON is condensed as text)."""
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        value = orjson.loads(text)
        orjson.dumps(value)
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        return None
    return value


def condense_json(text: str, max_chars: int, *, or_smallest: bool = False, fill: bool = False) -> str | None:
    """Structure-preserving shrink of a JSON document; None if `text` is not JSON, or if it cannot
    fit and not `or_smallest` (then its smallest shrink, where JSON must stay JSON).

    Cuts go in steps, fullest first. At the first step, as many items and as long strings as fit
    are kept; at a later one too with `fill` (a protected message kept at a size), otherwise the
    step as it is (old messages cut to the step, not filled: fuller trims push the rest harder)."""
    value = json_document(text)
    if value is None:
        return None
    option = orjson.OPT_INDENT_2 if "\n" in text.lstrip() else 0
    memo: dict[int, list[int]] = {}

    def shrunk(cut: _Cut) -> str:
        return orjson.dumps(_shrink(value, cut, memo), option=option).decode()

    steps = _JSON_STEPS + (_JSON_LAST_RESORT if or_smallest else ())
    for cut in steps:
        fitting = shrunk(cut)
        if len(fitting) <= max_chars:
            break
    else:
        return fitting if or_smallest and len(fitting) < len(text) else None
    if cut != steps[0] and not fill:
        return fitting
    # Room for more than the step's items: about as many as fit (a list of records cut to
    # 16 kept ~1k tokens whatever the cap: half of a 2k-token cap, an eighth of an 8k one). Sizes
    # grow about linearly with the items kept, so each guess scales the last fitting one.
    low, high = cut.items, max_chars // 2  # an item takes two characters at least
    for _ in range(JSON_FILL_ATTEMPTS):
        if low >= high:
            break
        guess = min(high, int(low * max_chars / max(1, len(fitting))))
        if guess <= low:
            guess = (low + high + 1) // 2
        candidate = shrunk(cut._replace(items=guess))
        if len(candidate) == len(fitting):
            break  # no list was cut any more: nothing left to add
        if len(candidate) <= max_chars:
            low, fitting = guess, candidate
        else:
            high = guess - 1
    # Then longer strings while they fit: a file written by a tool call is one long string, cut to
    # the first step's length whatever the cap (~145 tokens, under the floor of a protected trim).
    chars, longer = cut.chars, cut.chars * 2
    while chars < max_chars:
        candidate = shrunk(cut._replace(items=low, chars=longer))
        if len(candidate) > max_chars or len(candidate) == len(fitting):
            break
        chars, fitting, longer = longer, candidate, longer * 2
    # Kept at a size: between the doublings too (one doubling can be a protected message's floor).
    for _ in range(JSON_FILL_ATTEMPTS if fill else 0):
        middle = (chars + longer) // 2
        if middle <= chars:
            break
        candidate = shrunk(cut._replace(items=low, chars=middle))
        if len(candidate) <= max_chars:
            chars, fitting = middle, candidate
        else:
            longer = middle
    return fitting
