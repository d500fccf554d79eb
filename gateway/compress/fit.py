"""Fit a conversation into a token budget: the staged pipeline and its result.

Stages, cheapest and least lossy first; the first rung that fits wins:
  1 reasoning     drop reasoning fields and thinking blocks
  2 tool_results  trim tool outputs to each cap of a ladder in turn (head, tail,
                  informative lines; JSON by structure)
  3 tool_results  replace tool outputs by a one-line placeholder that keeps
                  their last error lines (images and files inside tool results
                  go with them)
  4 truncate      middle-truncate long messages (head, tail, sentences with facts),
                  then, as the last rung, replace old images, audio and files by a
                  one-line placeholder: an omitted image is lost whole, so it goes
                  only when truncating text is not enough, but before any turn
  5 drop_turns    remove whole turns behind one marker message: the opening of
                  the history (task statement, first facts) is kept up to a
                  share of the budget, turns after it go oldest first; then
                  older steps of the latest turn, oldest first, behind a
                  second marker after its user message. Each marker carries
                  an account of its span within `digest_ratio` of the budget:
                  a summary given for that exact span (`summaries`, made
                  outside by an LLM), else the extractive digest (digest.py).
                  A summary stands for exactly what was dropped, so where to
                  cut never depends on it: the room is reserved either way
  6 protected     trim protected messages, largest first, the newest step
                  last, to the largest cap that fits (three quarters of the
                  largest, then halving), or refuse; what the trim leaves
                  free takes the newest dropped turns and steps back
Stages 1–5 never touch system or developer messages, the latest user message
or the recent steps of its turn.

Agent loops. A coding or research agent answers one user message with many
steps (an assistant tool call and the results answering it), sending a request
after each; the latest turn is then most of the prompt. Its newest steps are
protected: at least the newest, and more up to `recent_steps_ratio` of the
budget, or as far back as the room left with every older message at its
placeholder form allows, whichever reaches further: a loop fills its budget
with whole recent results rather than trimmed old ones. Older steps are
history, dropped on the same grid as older turns (after them); they skip the
rungs and go straight to their aged form (the call stays, the result becomes a
note, the assistant's own text and long arguments are cut to `aged_step_cap`),
so an aged step changes form once, not once per rung. The exception is a step larger than the
window's share (a file read, a build log): as a note it freed more than the window could take,
and a loop 300 tokens over budget kept 5% of it, so the newest such steps keep their results cut
to the room left, on a few caps fixed by the budget (`_kept_big_steps`). Agents that reason aloud
before each call spend a quarter to a half of a loop on that text: kept whole,
it made aged steps too big to keep (on public SWE-bench transcripts at 1/3,
40% of the calls kept before, 62% after; on a second set, 45% with the text
cut to 64 tokens, 60% at 32). The boundary sits on a grid over the turn's
steps (where their running size crosses a multiple of the cut quantum), so it
stays put while steps append and then jumps a whole quantum; it only moves
forward (a later request has more steps and no more room). Each jump re-sends
the steps it ages as placeholders: the prefix breaks there, about every
quantum of steps, which is the cost of keeping the newest results whole. Aged
steps are dropped on the history's grid, in their placeholder sizes, where a
quantum can hold most of a loop's steps: that grid alone drops none or nearly
all of them (a newest result over half the budget cost 22 of 24 older calls
whose placeholders nearly all fit). So the window's grid points (original
sizes) are finer cuts, taken only where they leave the recent steps room to
grow to their share: the window grows until it jumps, and the jump re-sends
the tail anyway, so such a cut moves with the window, not at every step.
Measured on bench/quality.py's loops at 1/6, 1/10, 1/20: calls kept 89/71/28%
before, 91/72/29% after, prefix stability the same, -0.004, -0.008; finer cuts
without that room kept 91/77/34% but cost -0.02 and -0.12. When even the
dropped history is not enough, the fit is redone with only the newest step
protected, and only then, the markers' digests and then the markers given up
first, are protected messages trimmed; a request is refused only when the
system prompt, the latest user message and the newest step cannot fit at the
floor.

Cache stability. A unit's transformed form depends only on that unit and the
options, so the same old message is compressed the same way on every
request. Each rung of stages 1–4 applies to the whole history (older steps
at least at their placeholder form) or not at all: on a growing
conversation the previous compressed prompt is then reproduced byte for
byte, followed by the newly old messages in compressed form, and the prefix
only breaks when the rung changes. Applying
a rung oldest-first up to a moving cut was measured to break the prefix at the
cut nearly every turn: the history after the cut grows at the weaker rung's
size, so the cut has to move again almost at once.

A rung change re-cuts the history from the first message it changes (nearly
the whole prompt misses the cache), so rungs are climbed with hysteresis: a
rung is skipped when, where the history first overflowed the rung before it,
it would leave less than `rung_headroom` of the room free: it would only last
a few turns. That point is a prefix of the history, the same for every later
request, so the choice never flips back. The trade-off is deliberate: skipping
compresses harder a little earlier (after the last rung, it drops turns) in
exchange for one full cache miss less; measured on a growing 60-turn agent
conversation at a tenth of its final size, 0.940 of each prompt stayed a
cached prefix of the next before, 0.956 after (bench/quality.py).

A whole rung at once is coarse: the rung that fits can leave much of the room
unused (every old output at one cap, or all of them placeholders). With
`fill_quantum` set (off by default: it costs prefix stability), the room
left goes to the newest old units, which stay one level back down the ladder,
from a boundary on a grid over the history (`fill_quantum`); the boundary is
never behind where an earlier turn's opening request put it, and moving it
re-sends only the units it passes, late in the prompt. Measured in
bench/quality.py (chat at 1/1.5, 1/3, 1/10): budget use 0.65/0.65/0.84
without it, 0.86/0.86/0.94 with a grid of a quarter of the budget, at a cost
in prefix stability of 0/0.023/0.046; finer grids fill more and break more
(README, fill_quantum). Agent loops read the same either way: an aged step
never takes a trimmed form back.

Stage 5 moves its cut only on a coarse grid: where the cumulative size of the
(already compressed) history crosses a multiple of a quantum, a fraction of
the budget. While the cut stays put, requests append; when it moves, it
frees a whole quantum, which is the hysteresis that lets the next turns
append again. The head stays at the last rung climbed, so entering the drop
phase keeps the head cached (it is the very prefix the requests before sent).

Decisions only move forward. The request that opened each earlier turn is
known (its history and user message are part of this one); a request never
takes a weaker rung, nor moves the cut back, than such a request needed, so a
big latest turn (an image, a pasted file) that forced more compression is not
undone by the next, smaller one, which would break the prefix twice. The
gateway sees each request fresh: no state is needed.

Aggressive mode fits to a share of the budget but climbs the same rungs and
cuts on the same grid (both depend on the budget, not on the target), only
further: it never keeps more than auto for the same budget, and never trims
a protected message for headroom that auto keeps whole.
"""

from __future__ import annotations

import hashlib
import threading
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from itertools import accumulate
from typing import Any, overload

from gateway.compress.digest import digest
from gateway.compress.options import CompressionOptions
from gateway.compress.signed_thinking import starts_with_thinking, unpinned
from gateway.compress.transforms import (
    MEDIA_KINDS,
    TOOL_ANSWER_ROLES,
    drop_reasoning,
    map_tool_results,
    message_texts,
    omit_media,
    omit_tool_result_media,
    part_lengths,
    placeholder,
    text_chars,
    tool_names,
    tool_result_texts,
    trim_tool_text,
    truncate_message,
    truncate_reasoning,
)
from gateway.compress.units import PROTECTED_ROLES, Unit, group_units, is_tool_result_carrier
from gateway.tokens.counter import TokenCounter, counter_for
from gateway.tokens.formats import NestedTooDeeply, compact_json

Message = Mapping[str, Any]
Form = tuple[Message, ...]
Transform = Callable[[Message, float], Message]  # (message, its chars per token) -> message
Trimmed = tuple[int, dict[int, Message]]  # a prompt's size with protected messages trimmed, and those

# A trim rung is computed only if its estimate is within this factor of the budget
# (the estimate only filters and places rungs; what is kept is always counted exactly).
TRIM_ESTIMATE_SLACK = 1.0
# A protected message at the floor is trimmed to within this many tokens over it, in at most
# this many attempts (each a trim and a count of a floor-sized message).
FLOOR_TRIM_SLACK = 16
FLOOR_TRIM_ATTEMPTS = 10
ALL_STAGES = ("reasoning", "tool_results", "truncate", "drop_turns", "protected")
# What a result reports: the stages, and what stood for the dropped spans (an LLM summary or the digest).
REPORTED = ("reasoning", "tool_results", "truncate", "drop_turns", "digest", "summary", "protected")


@dataclass(frozen=True)
class _Level:
    """One rung of stages 1-4: a transform of every old unit's form at rung `base`."""

    stage: str
    base: int
    transform: Transform


class ContextBudgetExceeded(ValueError):
    """The prompt cannot fit even with every stage applied; carries the numbers for a 400."""

    def __init__(self, tokens: int, budget: int, minimum: int, stages: tuple[str, ...]) -> None:
        self.tokens = tokens
        self.budget = budget
        self.minimum = minimum
        self.stages = stages
        super().__init__(
            f"This prompt needs {tokens:,} tokens and could be compressed to no fewer than "
            f"{minimum:,} (tried: {', '.join(stages) or 'nothing'}) without losing the system prompt "
            f"or the latest user message, but the budget is {budget:,} tokens."
        )


@dataclass(frozen=True)
class DroppedSpan:
    """A run of messages the drop stage removed, as a summarizer needs it.

    `key` names its content (`span_key`); `previous` is how many of its first
    messages formed the span of the grid cut before this one (0: none), so a
    summary of this span can build on the summary of that shorter one.
    `account` is what the marker carries: "summary", "digest" or "" (none fit).
    """

    key: str
    messages: tuple[Message, ...]
    previous: int
    room: int  # tokens an account of this span may take
    account: str
    index: int = 0  # position of its marker in the result's messages


@dataclass(frozen=True)
class FitResult:
    messages: list[Message]
    tokens_before: int
    tokens_after: int
    budget_tokens: int
    stages: tuple[str, ...]  # names from REPORTED, in that order; empty when unchanged
    messages_dropped: int
    spans: tuple[DroppedSpan, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.stages)


def omitted_marker(dropped: Sequence[Message], account: str = "") -> dict[str, Any]:
    """The message standing for a dropped span (whole turns, or whole steps of the latest turn).

    A user message: it precedes a kept user turn or a kept step (strict APIs
    accept two user messages in a row; Anthropic merges them), never sits
    inside a tool pair, and unlike a mid-conversation system message works
    with every upstream. `account` (a summary or the digest of the span)
    follows the count, so the model still knows what the dropped turns held.
    """
    count = len(dropped)
    noun = "message" if count == 1 else "messages"
    line = f"[context-gateway: {count:,} earlier {noun} omitted to fit the context window"
    if not account:
        return {"role": "user", "content": line + "]"}
    return {"role": "user", "content": f"{line}; what they held:]\n{account}"}


def with_summaries(result: FitResult, summaries: Mapping[str, str], *, model: str) -> FitResult:
    """`result` with the summaries given for its dropped spans in their markers, instead of digests.

    The same as fitting again with `summaries` (where to cut never depends
    on them), without the cost: a caller that learns which spans are dropped
    from a first fit looks their summaries up, then only swaps the markers.
    """
    counter = counter_for(model)
    messages = list(result.messages)
    spans: list[DroppedSpan] = []
    after = result.tokens_after
    for span in result.spans:
        summary = summaries.get(span.key)
        if span.account == "summary" or not _usable(summary, span.room, counter):
            spans.append(span)
            continue
        marker = omitted_marker(span.messages, summary or "")
        after += counter.message(marker) - counter.message(messages[span.index])
        messages[span.index] = marker
        spans.append(replace(span, account="summary"))
    if all(a is b for a, b in zip(spans, result.spans, strict=True)):
        return result
    accounts = {span.account for span in spans if span.account}
    stages = (set(result.stages) - {"digest", "summary"}) | accounts
    return replace(
        result,
        messages=messages,
        tokens_after=after,
        stages=tuple(name for name in REPORTED if name in stages),
        spans=tuple(spans),
    )


def _usable(summary: str | None, room: int, counter: TokenCounter) -> bool:
    """A summary stands for its span only when there is one and it fits the span's room."""
    return bool(summary) and room > 0 and counter.text(summary or "") <= room


def span_key(messages: Sequence[Message]) -> str:
    """A name for a span's content: equal spans, on any replica, get the same key."""
    data = compact_json(list(messages), sort_keys=True).encode("utf-8", errors="surrogatepass")
    return hashlib.sha256(data).hexdigest()[:32]


def _check_arguments(
    messages: object,
    model: object,
    budget_tokens: object,
    tools: object,
    options: object,
    aggressive: object,
    summaries: object,
) -> None:
    """A library caller's mistake named at the door, not an error from deep inside the engine (or
    none: a string iterates as one-letter messages). Once per call, linear in the messages."""
    _check_dicts("messages", messages)
    if not isinstance(model, str):
        raise TypeError(f"model must be a str, got {type(model).__name__}")
    if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int):
        raise TypeError(f"budget_tokens must be an int, got {type(budget_tokens).__name__}")
    if tools is not None:
        _check_dicts("tools", tools)
    if not isinstance(options, CompressionOptions):
        raise TypeError(f"options must be a CompressionOptions, got {type(options).__name__}")
    if not isinstance(aggressive, bool):
        raise TypeError(f"aggressive must be a bool, got {type(aggressive).__name__}")
    if summaries is not None:
        if not isinstance(summaries, Mapping):
            raise TypeError(
                f"summaries must be a mapping of span keys to str, got {type(summaries).__name__}"
            )
        for key, text in summaries.items():
            if not isinstance(key, str) or not isinstance(text, str):
                raise TypeError(
                    f"summaries must map span keys (str) to summaries (str), got "
                    f"{type(key).__name__} -> {type(text).__name__}"
                )


def _check_dicts(name: str, value: object) -> None:
    """``value`` is a sequence of mappings (not one mapping, not a string)."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a list of dicts, got {type(value).__name__}")
    if all(type(item) is dict for item in value):  # the usual case, without ABC checks (~4x faster)
        return
    for index, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise TypeError(f"{name}[{index}] must be a dict, got {type(item).__name__}")


def fit(
    messages: Sequence[Message],
    *,
    model: str,
    budget_tokens: int,
    tools: Sequence[Any] | None = None,
    options: CompressionOptions = CompressionOptions(),  # noqa: B008 - frozen, safe to share
    aggressive: bool = False,
    summaries: Mapping[str, str] | None = None,
) -> FitResult:
    """Return messages that fit `budget_tokens` (tools included), or raise ContextBudgetExceeded.

    Pure and deterministic; the input is never mutated (changed messages are
    new dicts, unchanged ones are the very same objects). A prompt that
    already fits is returned as is, which also makes fit idempotent.

    `aggressive=True` fits to `options.aggressive_ratio` of the budget when it
    can, else to the budget; it never keeps more tokens than the plain fit.

    `summaries` maps `span_key`s to summaries of those spans (from an LLM,
    made outside): a dropped span's marker carries its summary when one is
    given and fits the span's room, else the span's digest. Where to cut never
    depends on them (the room is reserved either way), so the result's
    `spans` name what a summarizer should summarize for the next request.

    Arguments of the wrong type raise TypeError, and values nested too deeply to count
    ValueError, each naming the argument.
    """
    _check_arguments(messages, model, budget_tokens, tools, options, aggressive, summaries)
    counter = counter_for(model)
    try:
        sizes = [counter.message(message) for message in messages]
    except NestedTooDeeply:
        raise ValueError("messages: a message nests values too deeply to count") from None
    try:
        fixed = counter.messages([]) + counter.tools(tools)
    except NestedTooDeeply:
        raise ValueError("tools: a tool definition nests values too deeply to count") from None
    before = fixed + sum(sizes)
    unchanged = FitResult(list(messages), before, before, budget_tokens, (), 0)
    target = int(budget_tokens * options.aggressive_ratio) if aggressive else budget_tokens
    if before <= target:
        return unchanged
    plain = partial(_Fitter, messages, sizes, fixed, counter, options)
    if not aggressive:
        return plain(budget_tokens, budget_tokens, summaries).run()
    # Aggressive prefers the deeper cut on the budget's own rungs and grid (cache-stable). But an
    # account's room is reserved from the budget and grows with what its span drops, so with
    # digests that cut can keep more than the plain fit, or miss a headroom that a fit to the
    # headroom alone reaches. The smallest of the three keeps both promises (ties: the first).
    # Headroom is a wish and the budget a limit: what the plain fit keeps whole (system prompt,
    # latest user message, newest step) is never trimmed for headroom.
    results: list[FitResult] = []
    refusals: list[ContextBudgetExceeded] = []
    plain_fit: FitResult | None = None
    for index, (goal, grid) in enumerate(
        ((target, budget_tokens), (budget_tokens, budget_tokens), (target, target))
    ):
        if goal == budget_tokens and before <= budget_tokens:
            result = unchanged
        else:
            try:
                result = plain(goal, grid, summaries).run()
            except ContextBudgetExceeded as refusal:
                refusals.append(refusal)
                continue
        plain_fit = result if index == 1 else plain_fit
        results.append(result)
    if not results:
        raise refusals[1]  # the plain fit's refusal (the second): its numbers describe the real budget
    if plain_fit is not None and "protected" not in plain_fit.stages:
        results = [result for result in results if "protected" not in result.stages]
    return min(results, key=lambda result: result.tokens_after)


def upcoming_spans(
    messages: Sequence[Message],
    *,
    model: str,
    budget_tokens: int,
    options: CompressionOptions = CompressionOptions(),  # noqa: B008 - frozen, safe to share
) -> tuple[DroppedSpan, ...]:
    """The spans a conversation that still fits will drop first, once it outgrows `budget_tokens`.

    The drop stage's grid over the history as it is now, with the rungs climbed so far kept
    for the head: its first cut depends only on the turns before it, so it is where the
    first drop of this conversation will cut unless a rung not yet climbed changes the head
    first. Empty while the history has no full grid cut yet. For a summarizer to start
    ahead of the drop.
    """
    counter = counter_for(model)
    sizes = [counter.message(message) for message in messages]
    fixed = counter.messages([])
    fitter = _Fitter(messages, sizes, fixed, counter, options, budget_tokens, budget_tokens, None)
    return fitter.first_drop()


class _Span(Sequence[Message]):
    """The messages of old units [a, b), read from the request only when iterated.

    Stage 5 weighs a marker at every candidate cut; listing the dropped span
    each time made that search quadratic in the number of messages. The
    length comes from cumulative message counts, an item by bisection.
    """

    def __init__(self, messages: Sequence[Message], units: Sequence[Unit], counts: list[int], a: int, b: int):
        self.messages, self.units, self.counts, self.a, self.b = messages, units, counts, a, b

    def __len__(self) -> int:
        return self.counts[self.b] - self.counts[self.a]

    def __iter__(self) -> Iterator[Message]:
        for unit in self.units[self.a : self.b]:
            yield from self.messages[unit.start : unit.end]

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if isinstance(index, slice):
            return list(self)[index]
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError(index)
        position += self.counts[self.a]
        k = bisect_right(self.counts, position) - 1
        return self.messages[self.units[k].start + position - self.counts[k]]


def _grid(weights: Sequence[int], quantum: int, start: int) -> list[int]:
    """Cut positions in (start, len]: where the running sum from start crosses a multiple of quantum."""
    cuts: list[int] = []
    total = 0
    mark = quantum
    for k in range(start, len(weights)):
        total += weights[k]
        if total >= mark:
            cuts.append(k + 1)
            mark = (total // quantum + 1) * quantum
    if not cuts or cuts[-1] != len(weights):
        cuts.append(len(weights))
    return cuts


class _Fitter:
    def __init__(
        self,
        messages: Sequence[Message],
        sizes: list[int],
        fixed: int,
        counter: TokenCounter,
        options: CompressionOptions,
        target: int,
        budget: int,
        summaries: Mapping[str, str] | None,
        narrow: bool = False,
    ) -> None:
        self.args = (messages, sizes, fixed, counter, options, target, budget, summaries)
        self.narrow = narrow
        self.summaries = summaries or {}
        self.grid: list[int] = []  # the drop stage's cut points, for the spans' `previous`
        self.messages = messages
        self.sizes = sizes
        self.counter = counter
        self.options = options
        self.target = target
        self.budget = budget
        self.fixed = fixed
        self.before = fixed + sum(sizes)
        self.names = tool_names(list(messages))
        self.signed_thinking = any(map(starts_with_thinking, messages))
        self.densities: dict[int, float] = {}
        self.text_densities: dict[int, float] = {}
        self.levels = self._ladder()
        units = group_units(messages)
        recent = self._recent_steps(units, narrow)
        # Steps of the latest turn older than the recent ones are history like older turns.
        self.units = [
            replace(u, protected=False) if u.step and i < recent else u for i, u in enumerate(units)
        ]
        self.old = [unit for unit in self.units if not unit.protected]
        self.old_counts = [0, *accumulate(u.end - u.start for u in self.old)]  # messages before each
        self.old_tokens = [0, *accumulate(map(self._unit_size, self.old))]  # their tokens, as sent
        self.recent_steps = sum(u.step for u in self.units[recent:])
        self.recent_size = sum(self._unit_size(u) for u in self.units[recent:] if u.step)
        # Old units before this one are older turns; from it on, older steps of the latest turn.
        self.first_step = next((k for k, u in enumerate(self.old) if u.step), len(self.old))
        self.base = fixed + sum(self._unit_size(u) for u in self.units if u.protected)
        # The part of the base that stays the same as the conversation grows: all but the
        # latest turn (in an agent loop: all but its recent steps).
        latest = max((k + 1 for k, u in enumerate(self.units) if not u.protected), default=0)
        stable = [u for u in self.units[:latest] if u.protected]
        self.stable_base = fixed + sum(self._unit_size(u) for u in stable)
        # What every earlier request of the conversation held besides its history: system messages.
        system = [u for u in self.units if messages[u.start].get("role") in PROTECTED_ROLES]
        self.system_base = fixed + sum(self._unit_size(u) for u in system)
        task = [u for u in self.units if u.protected and u.turn_start]
        self.task_size = self._unit_size(task[-1]) if task else 0  # the latest user message
        self.forms: dict[tuple[int, int], tuple[Form, int]] = {}
        self.prefixes: dict[int, list[int]] = {}
        self.trim_caps = dict(enumerate(options.tool_result_caps, start=2))  # level -> cap
        self.step_trims: dict[int, int] = {}  # cap -> level, for big older steps (_kept_big_steps)

    def _unit_size(self, unit: Unit) -> int:
        return sum(self.sizes[unit.start : unit.end])

    def _recent_steps(self, units: Sequence[Unit], narrow: bool) -> int:
        """Index of the first protected step of the latest turn: the newest steps that fit.

        At least the newest step; more from a point of a grid over the turn's
        steps (where their running size from the turn's start crosses a
        multiple of the quantum), the earliest point whose steps fit the
        share, or the room left with everything before that point at its
        placeholder form. Those points are the same for every request of a
        growing loop, and a later request has more steps and no more room, so
        the boundary stays put while steps append, then jumps a whole
        quantum; it never moves back. `narrow` keeps only the newest step:
        the last resort before trimming protected messages.
        """
        steps = [i for i, unit in enumerate(units) if unit.step]
        if not steps:
            return len(units)
        if narrow:
            return steps[-1]
        weights = [self._unit_size(units[i]) for i in steps]
        share = self.budget * self.options.recent_steps_ratio
        quantum = max(1, int(self.budget * self.options.cut_quantum))
        # The room the steps could have with all older messages at their placeholder form: of
        # the target, since a window sized to the budget leaves an aggressive fit no history.
        before = units[: steps[0]]
        room = self.target - self.fixed
        room -= sum(self._unit_size(u) if u.protected else self._placeholder_size(u) for u in before)
        suffix = sum(weights)
        position = 0
        for point in [0, *_grid(weights, quantum, 0)[:-1]]:
            suffix -= sum(weights[position:point])
            room -= sum(self._placeholder_size(units[i]) for i in steps[position:point])
            position = point
            if suffix <= max(share, room):
                return steps[point]
        return steps[-1]

    def _placeholder_size(self, unit: Unit) -> int:
        """The unit's tokens at the ladder's placeholder level, or in its aged form for a step.

        Old units' forms are cached by their index among old units, which this decides, so
        the chain of levels is applied here rather than through `form`.
        """
        chain = [self.aged_level if unit.step else self.placeholder_level]
        while chain[-1]:
            chain.append(self.levels[chain[-1]].base)
        total = 0
        for i in range(unit.start, unit.end):
            original = self.messages[i]
            message = original
            for level in reversed(chain[:-1]):
                message = self.levels[level].transform(message, self._density(level)(i))
            total += self.sizes[i] if message == original else self.counter.message(message)
        return total

    def _ladder(self) -> list[_Level]:
        """Levels 1..: reasoning, each trim cap, placeholder, each truncate cap, media (0: original),
        then the aged steps' own form, which is no rung.

        Trims and the placeholder all start from the reasoning-free form, so a
        placeholder states the original size; truncations add to placeholders,
        and the last rung omits old media on top of the last truncation. An
        aged step's form omits media and cuts its text to `aged_step_cap` on
        top of the placeholders.
        """
        names = self.names
        levels = [
            _Level("original", 0, lambda m, _: m),
            _Level("reasoning", 0, lambda m, _: drop_reasoning(m)),
        ]
        for cap in self.options.tool_result_caps:
            levels.append(_Level("tool_results", 1, partial(_trim, names, cap)))
        levels.append(_Level("tool_results", 1, partial(_placeholder, names)))
        placeholders = self.placeholder_level = len(levels) - 1
        for cap in self.options.truncate_caps:
            levels.append(_Level("truncate", placeholders, partial(_truncate, cap)))
        levels.append(_Level("truncate", len(levels) - 1, lambda m, _: omit_media(m)))
        self.top = len(levels) - 1
        # From the placeholders, not the last truncation: one cut, whose marker states what the
        # original held (a cut on top of a cut counted only the second: "401 chars" of 5,479).
        levels.append(_Level("truncate", placeholders, partial(_aged, self.options.aged_step_cap)))
        self.aged_level = len(levels) - 1
        return levels

    # -- forms of old units at each level ---------------------------------

    def _chars_per_token(self, index: int) -> float:
        """The message's own text density; images and other parts do not count as text."""
        if index not in self.densities:
            message = self.messages[index]
            tokens = self.sizes[index]
            content = message.get("content")
            if isinstance(content, list):
                media = [
                    part for part in content if isinstance(part, Mapping) and part.get("type") in MEDIA_KINDS
                ]
                if media:
                    tokens -= self.counter.message({"role": message.get("role"), "content": media})
            self.densities[index] = max(0.5, text_chars(message) / max(1, tokens))
        return self.densities[index]

    def _text_density(self, index: int) -> float:
        """The density of the message's text alone, for the aged form's small cap: the role, ids
        and call structure are a large share of an agent step's tokens (about half for a short
        command with a one-line thought), and counted in, they made its text look half as dense
        as it is, so a 32-token cap cut 60-character commands and 20-token thoughts."""
        if index not in self.text_densities:
            texts = message_texts(self.messages[index])
            tokens = sum(map(self.counter.text, texts))
            self.text_densities[index] = max(0.5, sum(map(len, texts)) / max(1, tokens))
        return self.text_densities[index]

    def _density(self, level: int) -> Callable[[int], float]:
        """The characters per token that turn `level`'s caps into characters, by message index."""
        return self._text_density if level == self.aged_level else self._chars_per_token

    def _effective(self, k: int, level: int) -> int:
        """Older steps of the latest turn skip the rungs: aged out of the recent window, a step
        goes straight to its aged form, so no later rung change re-sends it."""
        if k >= self.first_step and level > 0:
            return self.aged_level
        return level

    def form(self, k: int, level: int) -> tuple[Form, int]:
        return self._form(k, self._effective(k, level))

    def _form(self, k: int, level: int) -> tuple[Form, int]:
        key = (k, level)
        if key not in self.forms:
            unit = self.old[k]
            originals = self.messages[unit.start : unit.end]
            if level == 0:
                self.forms[key] = (tuple(originals), sum(self.sizes[unit.start : unit.end]))
            else:
                rung = self.levels[level]
                base, base_tokens = self._form(k, rung.base)
                density = self._density(level)
                form = tuple(
                    rung.transform(message, density(i))
                    for message, i in zip(base, range(unit.start, unit.end), strict=True)
                )
                # Count only what this level changed.
                tokens = base_tokens + sum(
                    self.counter.message(new) - self._size(old, i)
                    for new, old, i in zip(form, base, range(unit.start, unit.end), strict=True)
                    if new is not old
                )
                self.forms[key] = (form, tokens)
        return self.forms[key]

    def _size(self, message: Message, index: int) -> int:
        return self.sizes[index] if message is self.messages[index] else self.counter.message(message)

    def _stages_of(self, k: int, level: int) -> set[str]:
        stages: set[str] = set()
        level = self._effective(k, level)
        while level > 0:
            rung = self.levels[level]
            form, base = self._form(k, level)[0], self._form(k, rung.base)[0]
            if any(a is not b for a, b in zip(form, base, strict=True)):
                stages.add(rung.stage)
            level = rung.base
        return stages

    # -- search -----------------------------------------------------------

    def _full(self, level: int) -> int:
        if level in self.trim_caps:  # the real trim, not its estimate
            return self.base + sum(self.form(k, level)[1] for k in range(len(self.old)))
        return self._prefix(level)[-1]

    def run(self) -> FitResult:
        """The first rung climbed that fits, applied to the whole history; else drop turns.

        Never a weaker rung than the request that opened an earlier turn
        needed: on a growing conversation decisions only move forward, even
        when the latest turn shrinks (a big user message is followed by a
        small one).
        """
        openings = self._openings(0)
        rungs = self._rungs(openings)
        required = 0
        for t, base in openings:
            needed = [
                i
                for i, level in enumerate([0, *rungs])
                if base + self._prefix(level)[t] - self.base <= self.target
            ]
            if not needed:  # that request had to drop turns: so does this one
                return self._drop(rungs[-1] if rungs else 0)
            required = max(required, needed[0] - 1)
        for index, level in enumerate(rungs):
            if index >= required and self._fits(level):
                if not self.options.fill_quantum:
                    return self._result([level] * len(self.old), head=0, cut=0, protected={})
                # One step back down the ladder, not to the rung climbed from: after skipped
                # rungs that is often raw output, so large that few units could have it.
                return self._filled(level, level - 1)
        return self._drop(rungs[-1] if rungs else 0)

    def _filled(self, level: int, weaker: int) -> FitResult:
        """The history at `level`, its newest units at the `weaker` level before it while they fit.

        A rung applies to the whole history, and the one that fits can leave much of
        the room unused (one cap, then a placeholder for every output). Newer units
        matter more, so the room left goes to them, newest first, one level back
        down the ladder. The boundary sits on a grid over the history
        (where its running size at `level` crosses a multiple of the fill quantum),
        the same points for every request of a growing conversation, and it is never
        behind where the request that opened an earlier turn put it (a smaller latest
        turn must not move it back and forth): it stays put while turns append, then
        jumps a point forward. Only the units it passes change form, late in the
        prompt; the prefix before them stays.
        """
        n = len(self.old)
        at_level = self._prefix(level) if level not in self.trim_caps else self._exact_prefix(level)
        at_weaker = self._prefix(weaker) if weaker not in self.trim_caps else self._exact_prefix(weaker)
        sizes = [at_level[k + 1] - at_level[k] for k in range(n)]
        quantum = max(1, int(self.budget * self.options.fill_quantum))
        points = [0, *_grid(sizes, quantum, 0)[:-1]]

        def earliest(end: int, base: int) -> int:
            """The earliest point before `end` from which units can be weaker, for a request of `base`."""
            low, high = 0, bisect_left(points, end)  # points[high:] beyond `end`; find the first that fits
            limit = high
            while low < high:
                middle = (low + high) // 2
                b = points[middle]
                fits = base + at_level[b] - self.base + at_weaker[end] - at_weaker[b] <= self.target
                low, high = (low, middle) if fits else (middle + 1, high)
            return points[low] if low < limit else end

        boundary = earliest(n, self.base)
        for t, base in self._openings(0):
            boundary = max(boundary, earliest(t, base))
        levels = [level] * boundary + [weaker] * (n - boundary)
        if self.base + at_level[boundary] - at_level[0] + at_weaker[n] - at_weaker[boundary] > self.target:
            levels = [level] * n  # (weaker forms larger than the fitting level's: not worth a fill)
        return self._result(levels, head=0, cut=0, protected={})

    def _exact_prefix(self, level: int) -> list[int]:
        sums = [self.base]
        for k in range(len(self.old)):
            sums.append(sums[-1] + self.form(k, level)[1])
        return sums

    def _openings(self, after: int) -> list[tuple[int, int]]:
        """The requests that opened the turns after old unit `after`: (end of their history, their base).

        The request that opened turn t (a user message at old unit t) had the
        units before t as its history and that message as its latest turn.
        Requests made later in a turn (after tool calls) are not known: how
        much of the turn they held, and so what they needed, depends on when
        the client sent them.
        """
        openings = [
            (t, self.system_base + self._unit_size(unit))
            for t, unit in enumerate(self.old)
            if unit.turn_start and t > after
        ]
        if self.first_step < len(self.old) and self.first_step > after:
            # The request that opened the latest turn: its user message came before the old steps.
            openings.append((self.first_step, self.system_base + self.task_size))
        return openings

    def _fits(self, level: int) -> bool:
        return self._worth_computing(level) and self._full(level) <= self.target

    def _rungs(self, openings: list[tuple[int, int]]) -> list[int]:
        """The levels this conversation climbs, in ladder order: those with headroom when needed.

        Level L is needed where the history first overflows the rung before it
        (the last one climbed). At that prefix of the history, L must leave at
        least `rung_headroom` of the room free, or it is skipped for the next
        level (or the drop phase after the last): it would only last a few
        turns, and each rung change breaks the prompt prefix from the first
        message it changes. That prefix is a fixed point of a growing
        conversation, and the latest turn (whose size varies from request to
        request) is left out of the decision, so every later request climbs the
        same rungs. A rung that fits the current request is still taken only
        if it was climbed: skipping only ever happens while a change is due.
        Decisions depend on the budget, never on the aggressive target, so
        both modes climb the same rungs and aggressive only climbs further.
        """
        room = self.budget - self.stable_base  # for the history, the latest turn (recent steps) left out
        n = len(self.old)
        rungs: list[int] = []
        previous, last = self._prefix(0), 0
        for level in range(1, self.top + 1):
            if self._fits(last) and all(
                base + previous[t] - self.base <= self.target for t, base in openings
            ):
                break  # the last rung climbed fits this request and the earlier ones
            sums = self._prefix(level)  # prefixes include the whole base: compare histories only
            entry = min(n, bisect_right(previous, self.base + room))
            if sums[entry] - self.base <= (1.0 - self.options.rung_headroom) * room and sums[n] < previous[n]:
                rungs.append(level)
                previous, last = sums, level
        return rungs

    def _worth_computing(self, level: int) -> bool:
        """A trim is computed only when its estimate fits and placeholders would fit the budget.

        A placeholder is cheaper to compute than a trim and never larger.
        """
        if level not in self.trim_caps:
            return True
        placeholders = 2 + len(self.options.tool_result_caps)
        estimate = self._prefix(level)[-1]
        return estimate <= self.budget * TRIM_ESTIMATE_SLACK and self._full(placeholders) <= self.budget

    def _prefix(self, level: int) -> list[int]:
        """Cumulative size of the old units at a level (trims: their estimate, never computed here)."""
        if level in self.prefixes:
            return self.prefixes[level]
        if level in self.trim_caps:
            self.prefixes[level] = self._trim_prefix(self.trim_caps[level])
        else:
            sums = [self.base]
            for k in range(len(self.old)):
                sums.append(sums[-1] + self.form(k, level)[1])
            self.prefixes[level] = sums
        return self.prefixes[level]

    def _trim_prefix(self, cap: int) -> list[int]:
        """About what trimming every old tool result to `cap` would total, unit by unit, without trimming.

        A trim costs a pass over every result and a count of everything kept;
        a cap that clearly cannot fit is not worth either.
        """
        sums = [self.base]
        for k, unit in enumerate(self.old):
            form, tokens = self.form(k, 1)
            saved = 0.0
            for message, i in zip(form, range(unit.start, unit.end), strict=True):
                cpt = self._chars_per_token(i)
                saved += sum(max(0.0, len(text) / cpt - cap) for text in tool_result_texts(message))
            sums.append(sums[-1] + tokens - int(saved))
        return sums

    def _drop(self, head_level: int) -> FitResult:
        """Remove whole turns after a kept head, oldest first, at grid cuts on turn starts.

        The head stays at `head_level`, the last rung climbed, so the head is
        the very prefix the requests before the drop phase sent; the turns
        after it go to the top level. Old media never sit in the head (it is
        there to keep the task's text): a head holding some is taken at the
        top level. The head's room and the grid's quantum are fractions of the
        budget, not of the target, so the aggressive mode cuts on the same
        grid as auto, only further.
        """
        n = len(self.old)
        head, levels, weights, cuts, finer = self._drop_grid(head_level)
        # A finer cut must leave the recent steps room to grow to their share: the window only
        # grows until it moves, so such a cut stays put until steps age (the same request
        # re-sends the loop's tail then), not one step at a time. Without that room the coarse
        # grid decides, as for older turns.
        growth = max(0, int(self.budget * self.options.recent_steps_ratio) - self.recent_size)
        kept = self.base + sum(weights)
        position = head
        for cut in cuts:
            kept -= sum(weights[position:cut])
            position = cut
            if kept + self._marker_tokens(head, cut) + (growth if cut in finer else 0) <= self.target:
                later = self._past_cut(cuts, head, weights, cut)
                if kept - sum(weights[cut:later]) + self._marker_tokens(head, later) <= self.target:
                    cut = later  # (a marker one digit longer never outweighs the turns it replaces)
                return self._result(levels, head=head, cut=cut, protected={})
        # Not even the head fits with the latest turn: keep less of it, then none.
        for shorter in range(head - 1, -1, -1):
            kept -= weights[shorter]
            if self._head_may_end(shorter) and kept + self._marker_tokens(shorter, n) <= self.target:
                return self._result(levels, head=shorter, cut=n, protected={})
        return self._protected(levels)

    def _drop_grid(self, head_level: int) -> tuple[int, list[int], list[int], list[int], set[int]]:
        """The drop stage's head, the old units' levels and weights, its grid of cuts, and which of
        those are the finer cuts among the latest turn's steps.

        The grid is in the weights as sent, where an old step is only its placeholder: a quantum
        of them can be most of a loop's steps, so that grid alone offers to drop none or nearly
        all. The steps also have the recent window's grid (their original sizes), which ages
        them: its points are the finer cuts.
        """
        n = len(self.old)
        top = self.top
        head = self._head(head_level)
        if any(omit_media(m) is not m for k in range(head) for m in self.form(k, head_level)[0]):
            head_level = top
            head = self._head(head_level)
        levels = [head_level] * head + [top] * (n - head)
        weights = [self.form(k, level)[1] for k, level in enumerate(levels)]
        quantum = max(1, int(self.budget * self.options.cut_quantum))
        coarse = self._turn_cuts(_grid(weights, quantum, head))
        finer: set[int] = set()
        if self.first_step < n:
            sizes = [self._unit_size(unit) for unit in self.old]
            finer = {c for c in _grid(sizes, quantum, self.first_step) if c > head} - set(coarse)
        self.grid = sorted(finer.union(coarse))
        return head, levels, weights, self.grid, finer

    def first_drop(self) -> tuple[DroppedSpan, ...]:
        """The spans the drop stage removes at the first cut of its grid, the rungs climbed so far
        kept for the head: what a conversation that still fits will drop first."""
        rungs = self._rungs(self._openings(0))
        head, _, _, cuts, _ = self._drop_grid(rungs[-1] if rungs else 0)
        cut = next((c for c in cuts if c > head and c < len(self.old)), None)
        if cut is None:
            return ()
        return tuple(span for _, span, _ in self._spans_out(head, cut, accounts=True))

    def _past_cut(self, cuts: list[int], head: int, weights: list[int], cut: int) -> int:
        """The cut, moved forward to where an earlier request of the conversation had to cut.

        Only requests whose history ran past the cut matter: the others had
        nothing more to drop. Without this, a big latest turn (an image, a
        pasted file) moves the cut forward and the next request moves it back,
        breaking the prefix twice.
        """
        sums = [0]
        for weight in weights:
            sums.append(sums[-1] + weight)
        for t, base in self._openings(cut):
            # Try the cut, then the grid cuts after it; walked by index, since copying the rest
            # of the grid for every opening made this quadratic.
            c, later = cut, bisect_right(cuts, cut)
            while True:
                c = min(c, t)
                fits = base + sums[head] + sums[t] - sums[c] + self._marker_tokens(head, c) <= self.target
                # At t the test no longer changes: every later cut is clamped to it too.
                if fits or c == t or later == len(cuts):
                    break
                c, later = cuts[later], later + 1
            cut = c
        return cut

    def _head(self, level: int) -> int:
        """How many old units, from the first, fit the head's room at `level` (older turns only).

        An agent loop's opening is its task, the protected user message; its
        old steps are not a head: they go oldest first.
        """
        head = end = 0
        room = int(self.budget * self.options.keep_head_ratio)
        while head < self.first_step and self.form(head, level)[1] <= room:
            room -= self.form(head, level)[1]
            head += 1
            end = head if self._head_may_end(head) else end
        return end

    def _head_may_end(self, head: int) -> bool:
        """Whether a kept head of `head` old units may end there: not on tool results.

        The marker after the head is a user message. After a tool step's results it would join
        them into one user turn (Anthropic merges consecutive user messages), and the API takes
        a user turn with tool results, last before the latest question, as answering the
        assistant before it: with thinking on, that assistant must keep its signed thinking,
        which stage 1 dropped from the head.
        """
        if head == 0:
            return True
        last = self.messages[self.old[head - 1].end - 1]
        return last.get("role") not in TOOL_ANSWER_ROLES and not is_tool_result_carrier(last)

    def _turn_cuts(self, cuts: list[int]) -> list[int]:
        """Move each cut forward to a turn or step start: whole turns and steps go, pairs stay whole."""
        n = len(self.old)
        snapped: list[int] = []
        for cut in cuts:
            # The cuts ascend: no turn start lies before the last snapped one, so scan on from it.
            cut = max(cut, snapped[-1]) if snapped else cut
            while cut < n and not (self.old[cut].turn_start or self.old[cut].step):
                cut += 1
            if not snapped or snapped[-1] != cut:
                snapped.append(cut)
        return snapped

    def _spans(self, head: int, cut: int) -> list[tuple[int, int]]:
        """The dropped old units [head, cut) as runs: older turns, then older steps (one marker each)."""
        middle = self.first_step
        spans = [(head, min(cut, middle)), (max(head, middle), cut)]
        return [(a, b) for a, b in spans if a < b]

    def _dropped(self, a: int, b: int) -> Sequence[Message]:
        return _Span(self.messages, self.old, self.old_counts, a, b)

    def _dropped_count(self, head: int, cut: int) -> int:
        return sum(self.old_counts[b] - self.old_counts[a] for a, b in self._spans(head, cut))

    def _room(self, a: int, b: int) -> int:
        """Tokens the account of dropped run [a, b) may take: the digest share, at most half the run.

        Reserved whole when choosing the cut, so where to cut never depends on
        what the account turns out to be (nor on which summaries exist).
        """
        share = int(self.budget * self.options.digest_ratio)
        return min(share, (self.old_tokens[b] - self.old_tokens[a]) // 2)

    def _account(self, dropped: Sequence[Message], key: str, room: int) -> tuple[str, str]:
        """(kind, text) standing for a dropped run: its summary if given and within room, else its digest."""
        if room <= 0:
            return "", ""
        summary = self.summaries.get(key)
        if _usable(summary, room, self.counter):
            return "summary", summary or ""
        text = _digest(dropped, key, room, self.counter)
        return ("digest", text) if text else ("", "")

    def _spans_out(
        self, head: int, cut: int, accounts: bool
    ) -> list[tuple[int, DroppedSpan, dict[str, Any]]]:
        """(old unit index, span, marker) of each dropped run, with its account when `accounts`."""
        out = []
        for a, b in self._spans(head, cut):
            dropped = self._dropped(a, b)
            room = self._room(a, b) if accounts else 0
            key = span_key(dropped)
            kind, text = self._account(dropped, key, room)
            earlier = [c for c in self.grid if a < c < b]
            previous = len(self._dropped(a, earlier[-1])) if earlier else 0
            span = DroppedSpan(key, tuple(dropped), previous, room, kind)
            out.append((a, span, omitted_marker(dropped, text)))
        return out

    def _marker_tokens(self, head: int, cut: int, accounts: bool = True) -> int:
        """Tokens of the markers with their accounts' whole room (what the cut must leave free)."""
        return sum(self._marker_with_room(a, b, accounts) for a, b in self._spans(head, cut))

    def _marker_with_room(self, a: int, b: int, accounts: bool) -> int:
        room = self._room(a, b) if accounts else 0
        if room <= 0:
            return self.counter.message(omitted_marker(self._dropped(a, b)))
        # Weighed as sent: the account's header and line break (a one-token stand-in for the
        # account keeps a token of slack for where the account joins them), plus its whole room.
        return self.counter.message(omitted_marker(self._dropped(a, b), "x")) + room

    def _protected(self, levels: list[int]) -> FitResult:
        """Last resort: shrink protected messages to the largest cap that fits, down to the floor.

        Recent steps other than the newest are not worth a trimmed task: the
        whole fit is first retried with only the newest step protected. Then
        the largest protected messages are trimmed first, and the newest
        step's only once everything else is at its floor.
        """
        if not self.narrow and self.recent_steps > 1:
            return _Fitter(*self.args, narrow=True).run()
        n = len(self.old)
        # No account here: the prompt is being trimmed to its floor, a digest is a luxury. Without
        # the account's room, the protected messages may fit whole: then nothing is trimmed.
        marker = self._marker_tokens(0, n, accounts=False)
        if self.base + marker <= self.target:
            cut = self._refilled(levels, self.target - self.base - marker)
            return self._result(levels, head=0, cut=cut, protected={}, accounts=False)
        if self.base <= self.target:
            # Whole, but not beside even a bare marker (its ~20 tokens): the history goes without
            # one. Trimming a protected message for it would take a quarter of the largest.
            return self._result(levels, head=0, cut=n, protected={}, accounts=False, markers=False)
        indices = [i for unit in self.units if unit.protected for i in range(unit.start, unit.end)]
        newest = next((unit for unit in reversed(self.units) if unit.step), None)
        last = [i for i in indices if newest is not None and i >= newest.start]
        first = [i for i in indices if newest is None or i < newest.start]
        shrunk: dict[int, Message] = {}  # the groups before, at their smallest form
        best = self.before

        def trimmed_to(group: list[int], cap: int) -> Trimmed:
            """The prompt's size with `group` trimmed to `cap` (and the groups before at their
            smallest), and every trimmed message."""
            trimmed = {i: self._shrink_protected(i, cap) for i in group if self.sizes[i] > cap}
            trimmed.update(shrunk)
            diff = sum(self.counter.message(m) - self.sizes[i] for i, m in trimmed.items())
            return self.base + marker + diff, trimmed

        for group in (first, last):
            if not group:
                continue
            caps = self._trim_caps(group)
            # The first cap tried: the largest at which the group, each message at most the cap,
            # would fit beside the groups before.
            settled = sum(self.counter.message(m) - self.sizes[i] for i, m in shrunk.items())
            start = next(
                (
                    k
                    for k, cap in enumerate(caps)
                    if self.base + marker + settled + sum(min(0, cap - self.sizes[i]) for i in group)
                    <= self.target
                ),
                len(caps) - 1,
            )
            fitting, smallest = self._scan_caps(caps, start, partial(trimmed_to, group))
            if fitting is not None:
                total, trimmed = fitting
                cut = self._refilled(levels, self.target - total)
                return self._result(levels, head=0, cut=cut, protected=trimmed, accounts=False)
            best = min(best, smallest[0])
            shrunk = smallest[1]  # the next group is trimmed beside this one's smallest form
        raise ContextBudgetExceeded(self.before, self.budget, best, ALL_STAGES)

    def _scan_caps(
        self, caps: list[int], start: int, trim: Callable[[int], Trimmed]
    ) -> tuple[Trimmed | None, Trimmed]:
        """The trim at the largest of `caps` that fits (None: none did), and the smallest tried.

        From `caps[start]`, caps are tried upward while they fit (a trim of text with few
        informative lines comes out well under its cap), or else downward until one fits: a
        trim near the floor is rescaled up to reach it and can come out larger than at the
        cap above, so a smaller cap is no surer to fit. Each trim condenses the whole
        message: a message of megabytes is so condensed two or three times, not once per
        halving from its own size (nine times for 2 MB into 4k tokens).
        """
        tried = {start: trim(caps[start])}
        if tried[start][0] <= self.target:
            k = start
            while k > 0:
                tried[k - 1] = trim(caps[k - 1])
                if tried[k - 1][0] > self.target:
                    break
                k -= 1
            return tried[k], tried[k]
        for k in range(start + 1, len(caps)):
            tried[k] = trim(caps[k])
            if tried[k][0] <= self.target:
                return tried[k], tried[k]
        return None, min(tried.values(), key=lambda attempt: attempt[0])

    def _trim_caps(self, group: list[int]) -> list[int]:
        """Caps to trim `group` to, largest first: three quarters of its largest message, then
        halving, down to the floor. Few caps, the same on every request of a conversation (they
        depend only on the group), so consecutive requests that need about as much trim share
        the trimmed form; the first step is a quarter, not a half, because what a cap leaves free
        goes to older turns and steps, which rank below the protected messages."""
        floor = self.options.protected_floor_tokens
        top = max(self.sizes[i] for i in group)
        caps = [top * 3 // 4, *(top >> k for k in range(1, top.bit_length()))]
        return [cap for cap in caps if cap > floor] + [floor]

    def _refilled(self, levels: list[int], room: int) -> int:
        """Where to cut the history once protected messages fit with all of it dropped.

        A cap overshoots: what it leaves free takes the newest old
        turns and steps back at `levels`, from the newest while they fit, so a
        loop whose newest result had to be cut still shows the calls before it.
        """
        n = len(self.old)
        empty = self._marker_tokens(0, n, accounts=False)
        kept = 0
        cut = n
        for k in range(n - 1, -1, -1):
            kept += self.form(k, levels[k])[1]
            unit = self.old[k]
            if not (unit.turn_start or unit.step or k == 0):
                continue  # whole turns and steps come back, as they go
            if kept + self._marker_tokens(0, k, accounts=False) - empty > room:
                break
            cut = k
        return cut

    def _shrink_protected(self, index: int, cap: int) -> Message:
        """The message trimmed to about `cap` tokens, never below the floor (a promise).

        The character limit comes from the message's density, which a trim
        can change (it keeps whole lines and sentences, which may be denser
        than the average). A trim that falls below the floor, or any at the
        floor's cap, is searched for instead: the smallest trim filling its
        limit that keeps the floor; a message that cannot be trimmed to at
        least the floor is kept whole.
        """
        floor = self.options.protected_floor_tokens
        original = self.messages[index]
        cpt = self._chars_per_token(index)
        # The cap is the message's: its parts (text, arguments, reasoning, results carried
        # together) share it, as separate messages would each have their own.
        lengths = part_lengths(original)

        def trimmed(limit: int, fill: bool) -> tuple[Message, int]:
            share = _fair_share(lengths, limit)
            message = _trim(self.names, int(share / cpt), original, cpt, fill=fill)
            message = truncate_message(message, share, cpt, fill=fill)
            message = truncate_reasoning(message, share, cpt, fill=fill)
            return message, self.counter.message(message)

        if cap > floor:
            message, tokens = trimmed(int(cap * cpt), fill=False)
            if tokens >= floor or message is original:
                return message
        return self._floor_trim(original, self.sizes[index], trimmed, int(floor * cpt))

    def _floor_trim(
        self, original: Message, size: int, trimmed: Callable[[int, bool], tuple[Message, int]], limit: int
    ) -> Message:
        """The smallest filled trim of `original` that keeps the floor, within a few tokens.

        At the floor every protected message's overshoot adds up against the budget (four
        messages 35-75 tokens over each refused requests 190 tokens over their floors). A
        filled trim grows with its limit, so the limit is bisected: scaled up from the floor's
        until a trim keeps the floor, then halved between the two until one is close to it.
        """
        floor = self.options.protected_floor_tokens
        best, best_tokens = original, size
        low, high = 0, 0
        for _ in range(FLOOR_TRIM_ATTEMPTS):
            message, tokens = trimmed(limit, True)
            if message is original:
                if not low:
                    return original  # nothing to cut at the floor's limit
                high = limit  # cut whole there: the floor's trim lies between
            elif tokens >= floor:
                if tokens < best_tokens:
                    best, best_tokens = message, tokens
                if tokens <= floor + FLOOR_TRIM_SLACK:
                    break
                high = limit
            else:
                low = limit
            if high:
                if high - low <= 1:
                    break
                limit = (low + high) // 2
            else:
                # Up by what the count says is missing, and at least a quarter: trims whose size
                # moves in steps (a JSON item, a line) can stay under the floor for many small rises.
                limit = max(int(limit * floor / max(1, tokens)) + 16, limit * 5 // 4)
        return best

    # -- output -----------------------------------------------------------

    def _result(
        self,
        levels: list[int],
        *,
        head: int,
        cut: int,
        protected: dict[int, Message],
        accounts: bool = True,
        markers: bool = True,
    ) -> FitResult:
        """The fitted messages: old units [head, cut) dropped behind a marker per span (none
        without `markers`), the others at their level, protected messages as trimmed."""
        old_index = {unit.start: k for k, unit in enumerate(self.old)}
        spans = self._spans_out(head, cut, accounts) if markers else []
        marker_at = {k: marker for k, _, marker in spans}
        positions: dict[int, int] = {}
        placed: dict[int, tuple[int, int]] = {}  # old unit kept -> (its first index in out, its tokens)
        unit_stages: dict[int, set[str]] = {}
        out: list[Message] = []
        # With signed thinking, or a drop: what each message of `out` was (None: a marker, a
        # reshaped form), for the steps `unpinned` takes to text.
        originals: list[Message | None] = []
        track = self.signed_thinking or (markers and head < cut)
        after = self.fixed
        stages: set[str] = set()
        for unit in self.units:
            k = old_index.get(unit.start)
            if k is None:
                for i in range(unit.start, unit.end):
                    message = protected.get(i, self.messages[i])
                    out.append(message)
                    after += self.sizes[i] if message is self.messages[i] else self.counter.message(message)
                if track:
                    originals.extend(self.messages[unit.start : unit.end])
            elif head <= k < cut:
                if k in marker_at:
                    positions[k] = len(out)
                    out.append(marker_at[k])
                    after += self.counter.message(marker_at[k])
                    if track:
                        originals.append(None)
            else:
                unit_stages[k] = self._stages_of(k, levels[k])
                form, tokens = self.form(k, levels[k])
                placed[k] = (len(out), tokens)
                out.extend(form)
                after += tokens
                if track:
                    same = len(form) == unit.end - unit.start
                    originals.extend(self.messages[unit.start : unit.end] if same else [None] * len(form))
        if not protected:
            for k, (level, form, tokens) in self._kept_big_steps(levels, placed, self.target - after).items():
                start, aged = placed[k]
                out[start : start + len(form)] = form
                after += tokens - aged
                unit_stages[k] = (
                    {self.levels[level].stage}
                    if any(
                        new is not old
                        for new, old in zip(form, self.messages[self.old[k].start :], strict=False)
                    )
                    else set()
                )
        for unit_stage in unit_stages.values():
            stages |= unit_stage
        if track:
            for index, message in unpinned(out, originals, self.counter.message).items():
                after += self.counter.message(message) - self.counter.message(out[index])
                out[index] = message
        dropped = self._dropped_count(head, cut)
        if dropped:
            stages.add("drop_turns")
        stages |= {span.account for _, span, _ in spans if span.account}
        if protected:
            stages.add("protected")
        return FitResult(
            messages=out,
            tokens_before=self.before,
            tokens_after=after,
            budget_tokens=self.budget,
            stages=tuple(name for name in REPORTED if name in stages),
            messages_dropped=dropped,
            spans=tuple(replace(span, index=positions[k]) for k, span, _ in spans),
        )

    def _kept_big_steps(
        self, levels: list[int], placed: Mapping[int, tuple[int, int]], room: int
    ) -> dict[int, tuple[int, Form, int]]:
        """The newest older steps too big for the window, with their results trimmed to the room
        left, newest first, instead of their aged form: (level, form, tokens) by old unit.

        A step larger than the window's share (a file read, a build log, a page state) never fits
        the recent window, and its note frees more than the window can grow into before it
        moves: a 9,800-token loop fitted into 9,500 kept 519 tokens, the file the agent had just
        read reduced to a line. Such a step keeps its results cut to the largest cap the room
        allows: the whole step, then each result at most half the budget, a quarter, an eighth…
        Each form change re-sends the prompt from the step on, so the caps are fixed by the
        budget, the same for every request of a conversation: caps from the result's own size
        (three quarters, then halving) used the room better but, on Claude Code sessions at
        1/3 of their size, cost 0.09 of prefix stability where these cost 0.06; trimming every
        step over a quantum cost 0.09 on bench/quality.py's loops at 1/6.
        """
        share = self.budget * self.options.recent_steps_ratio
        kept: dict[int, tuple[int, Form, int]] = {}
        for k in range(len(self.old) - 1, self.first_step - 1, -1):
            unit = self.old[k]
            if k not in placed or self._effective(k, levels[k]) != self.aged_level:
                break  # dropped, or not an older step
            if self._unit_size(unit) <= share or room <= 0:
                break
            aged = placed[k][1]
            ladder = self._step_trim_levels(unit)
            # Trims of megabytes are condensed from the first cap whose estimate fits (and the one
            # before it: a trim can come in under its cap), not once per halving from the top.
            first = next((i for i, (_, size) in enumerate(ladder) if size <= aged + room), len(ladder))
            forms = ((level, *self._form(k, level)) for level, _ in ladder[max(0, first - 1) : first + 2])
            fitting = next((found for found in forms if aged < found[2] <= aged + room), None)
            if fitting is None:
                break
            kept[k] = fitting
            room -= fitting[2] - aged
        return kept

    def _step_trim_levels(self, unit: Unit) -> list[tuple[int, int]]:
        """(level, estimated tokens) for one big step: reasoning dropped, then its results cut to
        half the budget, halving (the caps under its largest result and over the smallest
        tool-result cap; a filled trim comes to about its cap, which is each result's: one
        message can carry a dozen)."""
        texts = (text for i in range(unit.start, unit.end) for text in tool_result_texts(self.messages[i]))
        results = [self.counter.text(text) for text in texts]
        whole = self._unit_size(unit)
        rest = whole - sum(results)
        top = max(results, default=0)
        floor = min(self.options.tool_result_caps)
        half = int(self.budget * self.options.cut_quantum) * 2
        caps = [c for c in (half >> j for j in range(half.bit_length())) if c < top]
        out = [(1, whole)]  # the reasoning rung: the step whole but for stale reasoning
        for cap in (c for c in caps if c >= floor):
            level = self.step_trims.get(cap)
            if level is None:
                self.levels.append(_Level("tool_results", 1, partial(_trim, self.names, cap, fill=True)))
                level = self.step_trims[cap] = len(self.levels) - 1
            out.append((level, rest + sum(min(n, cap) for n in results)))
        return out


# Digests of recent spans: a span stays dropped for many requests of a conversation, and its
# digest (linear in the span, but the span can be most of a long conversation) never changes.
DIGEST_CACHE_SIZE = 256
_DIGESTS: OrderedDict[tuple[str, int, str, float], str] = OrderedDict()
_DIGESTS_LOCK = threading.Lock()  # fit runs in worker threads too


def _digest(dropped: Sequence[Message], key: str, room: int, counter: TokenCounter) -> str:
    cache_key = (key, room, counter.model, counter.scale)  # what the digest depends on
    with _DIGESTS_LOCK:
        if cache_key in _DIGESTS:
            _DIGESTS.move_to_end(cache_key)
            return _DIGESTS[cache_key]
    text = digest(dropped, room, counter.text)
    with _DIGESTS_LOCK:
        _DIGESTS[cache_key] = text
        if len(_DIGESTS) > DIGEST_CACHE_SIZE:
            _DIGESTS.popitem(last=False)
    return text


def _fair_share(lengths: Sequence[int], total: int) -> int:
    """The largest per-part limit under which `lengths` sum to at most `total`: parts shorter than
    it stay whole, and what they leave goes to the longer ones."""
    remaining, left = total, len(lengths)
    for length in sorted(lengths):
        share = remaining // left
        if length > share:
            return share
        remaining, left = remaining - length, left - 1
    return total  # everything fits whole


def _trim(names: Mapping[str, str], cap: int, message: Message, cpt: float, *, fill: bool = False) -> Message:
    limit = int(cap * cpt)
    return map_tool_results(message, names, lambda text, _: trim_tool_text(text, limit, cpt, fill=fill))


def _truncate(cap: int, message: Message, cpt: float) -> Message:
    return truncate_message(message, int(cap * cpt), cpt)


def _aged(cap: int, message: Message, cpt: float) -> Message:
    return _truncate(cap, omit_media(message), cpt)


def _placeholder(names: Mapping[str, str], message: Message, cpt: float) -> Message:
    message = omit_tool_result_media(message)
    return map_tool_results(
        message, names, lambda text, result: placeholder(text, result.name, cpt, failed=result.failed)
    )
