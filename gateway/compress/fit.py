"""Fit a conversation into a token budget: the staged pipeline and its result.

Stages, cheapest and least lossy first; the first rung that fits wins:
  1 reasoning     drop reasoning fields and thinking blocks
  2 tool_results  trim tool outputs to each cap of a ladder in turn (head, tail,
                  informative lines; JSON by structure)
  3 tool_results  replace tool outputs by a one-line placeholder
  (an LLM summarizer would slot in here, between the lossless-ish and the lossy stages)
  4 truncate      middle-truncate long messages (head, tail, sentences with facts)
  5 drop_turns    remove whole turns behind one marker message: the opening of
                  the history (task statement, first facts) is kept up to a
                  share of the budget, turns after it go oldest first
  6 protected     trim the system prompt and the latest turn, or refuse
Stages 1–4 only touch units before the latest user turn (and never system or
developer messages); results of the latest turn are kept.

Cache stability. A unit's transformed form depends only on that unit and the
options, so the same old message is compressed the same way on every
request. Each rung of stages 1–4 applies to the whole history before the
latest turn or not at all: on a growing conversation the previous compressed
prompt is then reproduced byte for byte, followed by the newly old messages
in compressed form, and the prefix only breaks when the rung changes (once
per rung in a conversation's life; fewer rungs, fewer breaks). Applying a
rung oldest-first up to a moving cut was measured to break the prefix at the
cut nearly every turn: the history after the cut grows at the weaker rung's
size, so the cut has to move again almost at once.

Stage 5 moves its cut only on a coarse grid: where the cumulative size of the
(already compressed) history crosses a multiple of a quantum, a fraction of
the budget. While the cut stays put, requests append; when it moves, it
frees a whole quantum, which is the hysteresis that lets the next turns
append again. The gateway sees each request fresh: no state is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from gateway.compress.options import CompressionOptions
from gateway.compress.transforms import (
    drop_reasoning,
    map_tool_results,
    placeholder,
    text_chars,
    tool_names,
    tool_result_texts,
    trim_tool_text,
    truncate_message,
)
from gateway.compress.units import group_units
from gateway.tokens.counter import TokenCounter, counter_for

Message = Mapping[str, Any]
Form = tuple[Message, ...]
Transform = Callable[[Message, float], Message]  # (message, its chars per token) -> message

# Content parts that cost tokens without being text.
MEDIA = frozenset({"image_url", "image", "input_audio", "file"})
# A trim rung is computed only if its estimate is within this factor of the target
# (the estimate only filters; what is kept is always counted exactly).
TRIM_ESTIMATE_SLACK = 1.0
ALL_STAGES = ("reasoning", "tool_results", "truncate", "drop_turns", "protected")


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
class FitResult:
    messages: list[Message]
    tokens_before: int
    tokens_after: int
    budget_tokens: int
    stages: tuple[str, ...]  # stage names applied, in pipeline order; empty when unchanged
    messages_dropped: int

    @property
    def changed(self) -> bool:
        return bool(self.stages)


def omitted_marker(count: int) -> dict[str, Any]:
    """A user message: it precedes a kept user turn (strict APIs accept two user
    messages in a row; Anthropic merges them), never sits inside a tool pair,
    and unlike a mid-conversation system message works with every upstream."""
    noun = "message" if count == 1 else "messages"
    return {
        "role": "user",
        "content": f"[context-gateway: {count:,} earlier {noun} omitted to fit the context window]",
    }


def fit(
    messages: Sequence[Message],
    *,
    model: str,
    budget_tokens: int,
    tools: Sequence[Any] | None = None,
    options: CompressionOptions = CompressionOptions(),  # noqa: B008 - frozen, safe to share
    aggressive: bool = False,
) -> FitResult:
    """Return messages that fit `budget_tokens` (tools included), or raise ContextBudgetExceeded.

    Pure and deterministic; the input is never mutated (changed messages are
    new dicts, unchanged ones are the very same objects). A prompt that
    already fits is returned as is, which also makes fit idempotent.
    """
    counter = counter_for(model)
    sizes = [counter.message(message) for message in messages]
    fixed = counter.messages([]) + counter.tools(tools)
    before = fixed + sum(sizes)
    target = int(budget_tokens * options.aggressive_ratio) if aggressive else budget_tokens
    if before <= target:
        return FitResult(list(messages), before, before, budget_tokens, (), 0)
    try:
        return _Fitter(messages, sizes, fixed, counter, options, target, budget_tokens).run()
    except ContextBudgetExceeded:
        if target == budget_tokens:
            raise
    # The headroom is a wish, not a requirement: fit the plain budget instead.
    return _Fitter(messages, sizes, fixed, counter, options, budget_tokens, budget_tokens).run()


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
    ) -> None:
        self.messages = messages
        self.sizes = sizes
        self.counter = counter
        self.options = options
        self.target = target
        self.budget = budget
        self.fixed = fixed
        self.before = fixed + sum(sizes)
        self.units = group_units(messages)
        self.old = [unit for unit in self.units if not unit.protected]
        self.base = fixed + sum(sum(sizes[u.start : u.end]) for u in self.units if u.protected)
        self.names = tool_names(list(messages))
        self.forms: dict[tuple[int, int], tuple[Form, int]] = {}
        self.densities: dict[int, float] = {}
        self.levels = self._ladder()

    def _ladder(self) -> list[_Level]:
        """Levels 1..: reasoning, each trim cap, placeholder, each truncate cap (0: original).

        Trims and the placeholder all start from the reasoning-free form, so a
        placeholder states the original size; truncations add to placeholders.
        """
        names = self.names
        levels = [
            _Level("original", 0, lambda m, _: m),
            _Level("reasoning", 0, lambda m, _: drop_reasoning(m)),
        ]
        for cap in self.options.tool_result_caps:
            levels.append(_Level("tool_results", 1, partial(_trim, names, cap)))
        levels.append(_Level("tool_results", 1, partial(_placeholder, names)))
        placeholders = len(levels) - 1
        for cap in self.options.truncate_caps:
            levels.append(_Level("truncate", placeholders, partial(_truncate, cap)))
        return levels

    # -- forms of old units at each level ---------------------------------

    def _chars_per_token(self, index: int) -> float:
        """The message's own text density; images and other parts do not count as text."""
        if index not in self.densities:
            message = self.messages[index]
            tokens = self.sizes[index]
            content = message.get("content")
            if isinstance(content, list):
                media = [part for part in content if isinstance(part, Mapping) and part.get("type") in MEDIA]
                if media:
                    tokens -= self.counter.message({"role": message.get("role"), "content": media})
            self.densities[index] = max(0.5, text_chars(message) / max(1, tokens))
        return self.densities[index]

    def form(self, k: int, level: int) -> tuple[Form, int]:
        key = (k, level)
        if key not in self.forms:
            unit = self.old[k]
            originals = self.messages[unit.start : unit.end]
            if level == 0:
                self.forms[key] = (tuple(originals), sum(self.sizes[unit.start : unit.end]))
            else:
                rung = self.levels[level]
                base, base_tokens = self.form(k, rung.base)
                form = tuple(
                    rung.transform(message, self._chars_per_token(i))
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
        while level > 0:
            rung = self.levels[level]
            form, base = self.form(k, level)[0], self.form(k, rung.base)[0]
            if any(a is not b for a, b in zip(form, base, strict=True)):
                stages.add(rung.stage)
            level = rung.base
        return stages

    # -- search -----------------------------------------------------------

    def _full(self, level: int) -> int:
        return self.base + sum(self.form(k, level)[1] for k in range(len(self.old)))

    def run(self) -> FitResult:
        """The first level that fits applied to the whole history; else drop turns.

        A placeholder is cheaper to compute than a trim and never larger, so
        trims are only computed when placeholders would fit.
        """
        caps = self.options.tool_result_caps
        placeholder_level = 2 + len(caps)
        candidates = [1]
        if self._full(placeholder_level) <= self.target:
            candidates += [
                level
                for level, cap in enumerate(caps, start=2)
                if self._trim_estimate(cap) <= self.target * TRIM_ESTIMATE_SLACK
            ]
            candidates.append(placeholder_level)
        candidates += range(placeholder_level + 1, len(self.levels))
        for level in candidates:
            if self._full(level) <= self.target:
                return self._result([level] * len(self.old), head=0, cut=0, protected={})
        return self._drop()

    def _trim_estimate(self, cap: int) -> int:
        """About what trimming every old tool result to `cap` would total, without trimming.

        A trim costs a pass over every result and a count of everything kept;
        a cap that clearly cannot fit is not worth either.
        """
        saved = 0.0
        for k, unit in enumerate(self.old):
            for message, i in zip(self.form(k, 1)[0], range(unit.start, unit.end), strict=True):
                cpt = self._chars_per_token(i)
                saved += sum(max(0.0, len(text) / cpt - cap) for text in tool_result_texts(message))
        return self._full(1) - int(saved)

    def _drop(self) -> FitResult:
        """Remove whole turns after a kept head, oldest first, at grid cuts on turn starts."""
        n = len(self.old)
        top = len(self.levels) - 1
        levels = [top] * n
        weights = [self.form(k, top)[1] for k in range(n)]
        head = 0
        room = int(self.target * self.options.keep_head_ratio)
        while head < n and weights[head] <= room:
            room -= weights[head]
            head += 1
        quantum = max(1, int(self.target * self.options.cut_quantum))
        kept = self.base + sum(weights)
        position = head
        for cut in self._turn_cuts(_grid(weights, quantum, head)):
            kept -= sum(weights[position:cut])
            position = cut
            if kept + self._marker_tokens(head, cut) <= self.target:
                return self._result(levels, head=head, cut=cut, protected={})
        if head and self.base + self._marker_tokens(0, n) <= self.target:
            return self._result(levels, head=0, cut=n, protected={})
        return self._protected(levels)

    def _turn_cuts(self, cuts: list[int]) -> list[int]:
        """Move each cut forward to a turn start, so whole turns go and history resumes with the user."""
        n = len(self.old)
        snapped: list[int] = []
        for cut in cuts:
            while cut < n and not self.old[cut].turn_start:
                cut += 1
            if not snapped or snapped[-1] != cut:
                snapped.append(cut)
        return snapped

    def _dropped_count(self, head: int, cut: int) -> int:
        return sum(unit.end - unit.start for unit in self.old[head:cut])

    def _marker(self, head: int, cut: int) -> dict[str, Any] | None:
        return omitted_marker(self._dropped_count(head, cut)) if cut > head else None

    def _marker_tokens(self, head: int, cut: int) -> int:
        marker = self._marker(head, cut)
        return 0 if marker is None else self.counter.message(marker)

    def _protected(self, levels: list[int]) -> FitResult:
        """Last resort: shrink protected messages under a halving cap, down to the floor."""
        n = len(self.old)
        marker = self._marker_tokens(0, n)
        indices = [i for unit in self.units if unit.protected for i in range(unit.start, unit.end)]
        floor = self.options.protected_floor_tokens
        cap = max([self.sizes[i] for i in indices] + [floor])
        best = self.before
        while True:
            cap = max(floor, cap // 2)
            shrunk = {i: self._shrink_protected(i, cap) for i in indices if self.sizes[i] > cap}
            total = (
                self.base + marker + sum(self.counter.message(m) - self.sizes[i] for i, m in shrunk.items())
            )
            best = min(best, total)
            if total <= self.target:
                return self._result(levels, head=0, cut=n, protected=shrunk)
            if cap == floor:
                raise ContextBudgetExceeded(self.before, self.budget, best, ALL_STAGES)

    def _shrink_protected(self, index: int, cap: int) -> Message:
        cpt = self._chars_per_token(index)
        message = _trim(self.names, cap, self.messages[index], cpt)
        return truncate_message(message, int(cap * cpt), cpt)

    # -- output -----------------------------------------------------------

    def _result(self, levels: list[int], *, head: int, cut: int, protected: dict[int, Message]) -> FitResult:
        old_index = {unit.start: k for k, unit in enumerate(self.old)}
        marker = self._marker(head, cut)
        out: list[Message] = []
        after = self.fixed
        stages: set[str] = set()
        for unit in self.units:
            k = old_index.get(unit.start)
            if k is None:
                for i in range(unit.start, unit.end):
                    message = protected.get(i, self.messages[i])
                    out.append(message)
                    after += self.sizes[i] if message is self.messages[i] else self.counter.message(message)
            elif head <= k < cut:
                if k == head and marker is not None:
                    out.append(marker)
                    after += self.counter.message(marker)
            else:
                stages |= self._stages_of(k, levels[k])
                form, tokens = self.form(k, levels[k])
                out.extend(form)
                after += tokens
        dropped = self._dropped_count(head, cut)
        if dropped:
            stages.add("drop_turns")
        if protected:
            stages.add("protected")
        return FitResult(
            messages=out,
            tokens_before=self.before,
            tokens_after=after,
            budget_tokens=self.budget,
            stages=tuple(name for name in ALL_STAGES if name in stages),
            messages_dropped=dropped,
        )


def _trim(names: Mapping[str, str], cap: int, message: Message, cpt: float) -> Message:
    limit = int(cap * cpt)
    return map_tool_results(message, names, lambda text, _: trim_tool_text(text, limit, cpt))


def _truncate(cap: int, message: Message, cpt: float) -> Message:
    return truncate_message(message, int(cap * cpt), cpt)


def _placeholder(names: Mapping[str, str], message: Message, cpt: float) -> Message:
    return map_tool_results(message, names, lambda text, name: placeholder(text, name, cpt))
