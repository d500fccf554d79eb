"""OpenAI Responses: `instructions` plus `input` (a string or a list of items).

The chat view maps items onto the shapes gateway.compress already keeps
paired and whole:

- `instructions` becomes a first system message;
- user, system and developer message items are used as they are (they
  already have `role` and `content`; `input_text`, `input_image` and
  `input_file` parts are known to compress);
- each run of consecutive model-side items (assistant messages, `reasoning`,
  calls, and any other item type, such as server-run tool calls or
  `item_reference`) becomes ONE assistant message: its content holds the
  message parts and the reasoning and other items as blocks, its
  `tool_calls` the calls of tools the client runs (`CALLS`: functions,
  custom tools, the built-in `shell`, `local_shell` and `apply_patch`, and
  `computer`, whose object arguments the view holds as JSON text). A reasoning item
  therefore goes (stage 1 drops `reasoning` blocks) or stays whole, and is
  never separated from the call or message it produced;
- each call's output item becomes a `role: tool` message answering it, so
  the pair is one unit, and an agent loop of built-in tools has steps to
  compress as one of functions does. A shell output's chunks read as one
  text; changed, they go back as one chunk with the last one's outcome. A
  computer call's screenshot reads as an image; the API takes nothing but a
  screenshot in its output, so a computer step whose screenshot or reasoning
  compress dropped goes back as text in an assistant message (the action,
  then what stands for the screenshot; one kept whole follows the run's
  outputs as a user image), without its reasoning; a cut action object stays
  a call, as a shell's does;
- the API refuses an item sent with the id a reasoning model gave it but
  without the reasoning item it followed: where compress dropped a run's
  reasoning, its other items go without their ids (plain input), and a run
  holding an item whose id is required keeps its reasoning as a block no
  stage drops apart from the step.

Every part, call and output carries the index of the item it came from
(`ORIGIN`), which survives compress's copies; `emit` writes unchanged runs
back as their original items and changed ones as the original items with
only the changed text, arguments or output replaced. When the items are laid
out so that an output does not directly follow its call's run (other outputs
aside), the view is marked not fittable: the request is forwarded as it is
rather than risk an orphan.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.json_bytes import dumps_kept
from gateway.wire.base import ChatView, Message, counted_body
from gateway.wire.responses_memory import Conversions, Converted, Reuse

ORIGIN = "x_context_gateway_origin"
USER_SIDE_ROLES = frozenset({"user", "system", "developer"})


@dataclass(frozen=True)
class ToolKind:
    """The items of one kind of client-run tool: the call's field holding what the model asked
    (a string, or an object), its output item's type, and the name of a call that has none."""

    arguments: str
    output: str
    name: str = ""


CALLS = {
    "function_call": ToolKind("arguments", "function_call_output"),
    "custom_tool_call": ToolKind("input", "custom_tool_call_output"),
    "shell_call": ToolKind("action", "shell_call_output", "shell"),
    "local_shell_call": ToolKind("action", "local_shell_call_output", "local_shell"),
    "apply_patch_call": ToolKind("operation", "apply_patch_call_output", "apply_patch"),
    # (`action`; the GA tool may batch them as `actions`: `call_arguments` reads either)
    "computer_call": ToolKind("action", "computer_call_output", "computer"),
}
COMPUTER_CALL = "computer_call"
OUTPUT_TYPES = frozenset(kind.output for kind in CALLS.values())
# Items a reasoning model answered with after its reasoning, whose id is optional in an input: sent
# with their id, the API requires that reasoning item too ("Item 'msg_…' of type 'message' was
# provided without its required 'reasoning' item"); sent without, they are plain input items.
REASONED_ID_OPTIONAL = frozenset(
    {"message", "function_call", "custom_tool_call", "shell_call", "apply_patch_call"}
)
# Items that do not need their run's reasoning kept: those their id can be taken from, a computer
# call (which goes as text without it), and the reasoning itself. (An `item_reference` is all id:
# it stands for a produced item, and pins.)
UNPINNED = REASONED_ID_OPTIONAL | {"reasoning", COMPUTER_CALL}
PINNED_REASONING = "x_context_gateway_reasoning"  # a reasoning item as a block no stage drops alone
ENUM_CHARS = 16  # a cut built-in tool's text member up to this long is kept: it may name a kind


@dataclass
class _Layout:
    items: list[Any]
    string_input: bool
    has_instructions: bool
    fittable: bool = True
    # The items each message of the view stands for, by the id() of the message.
    produced: dict[int, range] = field(default_factory=dict)


def item_type(item: Mapping[str, Any]) -> object:
    """An item's type. A message may leave it out (or send null), and so may an item reference,
    which is all id."""
    kind = item.get("type")
    if kind is None:
        if "role" in item:
            return "message"
        if "id" in item:
            return "item_reference"
    return kind


def answered_call(output: Mapping[str, Any]) -> object:
    """The call id an output item answers: a local shell output names it as its `id`."""
    return output.get("id" if item_type(output) == "local_shell_call_output" else "call_id")


def call_arguments(call: Mapping[str, Any]) -> Any:
    """What a call asked, as the view holds it: an object (a built-in tool's action) as JSON text,
    its members smallest first. A tight cut keeps an object's first members and counts the rest:
    so it keeps the short ones (a patch's `type` and `path`) and leaves out the long ones (its
    diff, a long command), which go back empty."""
    kind = str(item_type(call))
    value = call.get(CALLS[kind].arguments, call.get("actions") if kind == COMPUTER_CALL else None)
    if isinstance(value, dict):
        value = dict(sorted(value.items(), key=lambda member: len(orjson.dumps(member[1]))))
    return orjson.dumps(value).decode() if isinstance(value, dict | list) else value


def output_content(output: Mapping[str, Any]) -> Any:
    """An output item's result, as the view holds it: a shell output's chunks as one text."""
    value = output.get("output")
    if item_type(output) == "computer_call_output":
        return [_screenshot_part(value)]
    if item_type(output) == "shell_call_output":
        chunks = [chunk for chunk in value if isinstance(chunk, Mapping)] if isinstance(value, list) else []
        return "".join(f"{chunk.get('stdout', '')}{chunk.get('stderr', '')}" for chunk in chunks)
    return "" if value is None else value


def _screenshot_part(screenshot: object) -> dict[str, Any]:
    """A computer call's screenshot as the input image part it is read as."""
    fields = screenshot if isinstance(screenshot, Mapping) else {}
    part = {"type": "input_image", "detail": "auto"}
    return part | {key: fields[key] for key in ("image_url", "file_id", "detail") if key in fields}


def _user_side(item: object) -> bool:
    return isinstance(item, Mapping) and item_type(item) == "message" and item.get("role") in USER_SIDE_ROLES


class ResponsesInput:
    name = "responses"
    prompt_field = "input"
    text_part = "input_text"

    def __init__(self, conversions: Conversions | None = None) -> None:
        # Only where nothing mutates items between requests (the route's parsed bodies): the
        # memory recognises a conversation's items by identity, not by value.
        self.conversions = conversions

    def view(self, payload: Mapping[str, Any]) -> ChatView:
        raw = payload.get("input")
        items: list[Any] = (
            [{"role": "user", "content": raw}]
            if isinstance(raw, str)
            else list(raw)
            if isinstance(raw, list)
            else []
        )
        instructions = payload.get("instructions")
        has_instructions = isinstance(instructions, str) and bool(instructions)
        layout = _Layout(items, isinstance(raw, str), has_instructions)
        system: list[Message] = [{"role": "system", "content": instructions}] if has_instructions else []
        converted = self._converted(layout)
        chat = [*system, *converted.messages]
        text = payload.get("text")
        output_format = text.get("format") if isinstance(text, Mapping) else None
        counted = counted_body(chat, payload.get("tools"), payload.get("max_output_tokens"), output_format)
        encoded: tuple[bytes, ...] | None = None
        if layout.fittable and len(converted.encoded) == len(converted.messages):
            encoded = (*map(dumps_kept, system), *converted.encoded)  # a dict of strings: always JSON
        return ChatView(chat, counted, layout, layout.fittable, encoded)

    def _converted(self, layout: _Layout) -> Converted:
        """The chat messages of `layout`'s items. With a memory: those of a known head as the last
        request made them (`responses_memory.py`), then the new items', with each message's JSON,
        remembered for the next request."""
        items, conversions = layout.items, self.conversions
        reuse = conversions.longest(items) if conversions is not None else Reuse()
        known, reused = reuse.converted, reuse.messages
        columns: tuple[list[Any], ...] = ([], [], [], [], [])
        messages, origins, _, _, encoded = columns
        if known is not None:
            for column, remembered in zip(columns, known.columns, strict=True):
                column += remembered[:reused]
            layout.produced = {id(m): origin for m, origin in zip(messages, origins, strict=True)}
        for made in self._messages(layout, origins[-1].stop if origins else 0):
            for column, value in zip(columns, made, strict=False):  # all but the JSON, written below
                column.append(value)
        if not layout.fittable:  # counted as the items are (never fitted): each field's text or JSON
            return Converted.bare(tuple(items))
        if conversions is None:
            return Converted.bare(messages)
        try:
            encoded += map(dumps_kept, messages[len(encoded) :])
        except TypeError:
            return Converted.bare(messages)
        converted = Converted(tuple(items), *map(tuple, columns))
        if len(messages) > reused:
            conversions.remember(converted, reuse.replaces)
        return converted

    def _messages(self, layout: _Layout, start: int) -> Iterator[tuple[Message, range, bool, bool]]:
        """Each chat message made from the items from `start` on (every call before it answered):
        the message, the items it stands for, whether it is a run, and whether every call is
        answered after it. Marks the layout not fittable, and stops, where
        an output does not follow its call's run."""
        items = layout.items
        pending: set[object] = set()  # call ids of the last run not yet answered
        i = start
        while i < len(items):
            item = items[i]
            if not isinstance(item, Mapping):
                layout.fittable = False
                return
            if _user_side(item):
                if pending:
                    layout.fittable = False
                    return
                origin = range(i, i + 1)
                layout.produced[id(item)] = origin  # written back as the very item
                i += 1
                yield item, origin, False, True
                continue
            if item_type(item) in OUTPUT_TYPES:
                call_id = answered_call(item)
                if call_id not in pending:
                    layout.fittable = False
                    return
                pending.discard(call_id)
                message = {"role": "tool", "tool_call_id": call_id, "content": output_content(item)}
                message[ORIGIN] = i
                origin = range(i, i + 1)
                layout.produced[id(message)] = origin
                i += 1
                yield message, origin, False, not pending
                continue
            end = i
            while end < len(items) and _in_run(items[end]):
                end += 1
            if pending:
                layout.fittable = False
                return
            run = self._run(items, i, end)
            pending = {call["id"] for call in run.get("tool_calls", ())}
            origin = range(i, end)
            layout.produced[id(run)] = origin
            i = end
            yield run, origin, True, not pending
        if pending:
            layout.fittable = False

    @staticmethod
    def _run(items: Sequence[Any], start: int, end: int) -> dict[str, Any]:
        """One assistant message standing for the model-side items[start:end]."""
        parts: list[Any] = []
        calls: list[Any] = []
        # An item that cannot go without its id needs its reasoning beside it: that reasoning is
        # a block compress keeps whole (it goes only with the whole step).
        pinned = any(_needs_its_reasoning(item) for item in items[start:end])
        for i in range(start, end):
            item = items[i]
            if not isinstance(item, Mapping):
                parts.append({"type": "x_item", ORIGIN: i})
                continue
            kind = item_type(item)
            if kind == "message":
                content = item.get("content")
                if isinstance(content, str):
                    parts.append({"type": "output_text", "text": content, ORIGIN: (i, -1)})
                elif isinstance(content, list):
                    parts += [
                        {**part, ORIGIN: (i, j)} if isinstance(part, Mapping) else part
                        for j, part in enumerate(content)
                    ]
            elif kind in CALLS:
                name = item.get("name", CALLS[str(kind)].name)
                function = {"name": name, "arguments": call_arguments(item)}
                calls.append({"id": item.get("call_id"), "type": "function", "function": function, ORIGIN: i})
            elif kind == "reasoning" and pinned:
                parts.append({**item, "type": PINNED_REASONING, ORIGIN: i})
            else:  # reasoning (a block stage 1 drops whole) or an item compress does not know: kept whole
                parts.append({**item, ORIGIN: i})
        run: dict[str, Any] = {"role": "assistant", "content": parts}
        if calls:
            run["tool_calls"] = calls
        return run

    def emit(self, payload: Mapping[str, Any], view: ChatView, messages: Sequence[Message]) -> dict[str, Any]:
        layout: _Layout = view.state
        out = dict(payload)
        rest = list(messages)
        if layout.has_instructions:
            out["instructions"] = rest.pop(0)["content"]
        items: list[Any] = []
        converted = _computer_steps_changed(layout, rest)
        later: list[Any] = []  # converted steps' screenshots kept whole: after their run's outputs
        for message in rest:
            role = message.get("role")
            if role != "tool":
                items += later
                later = []
            if role == "tool" and message.get(ORIGIN) in converted.outputs:
                continue  # read into its call's text
            indices = layout.produced.get(id(message))
            calls = [call[ORIGIN] for call in message.get("tool_calls") or ()]
            if indices is not None and not converted.shown.keys() & calls:  # the view's very message
                items += [layout.items[i] for i in indices]
            elif role in ("assistant", "tool"):
                items += _rebuild(layout.items, message, converted.shown)
                kept = (_screenshots(converted.shown.get(i)) for i in calls)
                later += [screenshot for screenshot in kept if screenshot is not None]
            else:  # a user-side item compress changed, or its omission marker
                items.append(message)
        items += later
        if layout.string_input and len(items) == 1 and isinstance(items[0].get("content"), str):
            out["input"] = items[0]["content"]
        else:
            out["input"] = items
        return out


@dataclass
class _Converted:
    """The computer steps that go as text: by call item index, what follows the action's text (the
    text standing for the screenshot, or the screenshot kept whole); and their outputs' indices."""

    shown: dict[int, list[Any]] = field(default_factory=dict)
    outputs: set[int] = field(default_factory=set)


def _computer_steps_changed(layout: _Layout, messages: Sequence[Message]) -> _Converted:
    """The computer steps compress changed: the screenshot answering them, the reasoning they
    followed (a call with its id needs it), or a batch of actions. The API takes nothing but a
    screenshot in a computer call's output, so such a step goes as text. Calls are told apart by
    item, not by call id, which a client may give twice."""
    changed: set[int] = set()
    screenshots: dict[int, tuple[int, Any]] = {}  # call index -> (output index, its view content)
    run: dict[object, int] = {}  # the last run's calls: call id -> call index
    for message in messages:
        untouched = layout.produced.get(id(message)) is not None
        calls = message.get("tool_calls") or ()
        if calls:
            run = {call["id"]: call[ORIGIN] for call in calls}
            lost = not untouched and _lost_reasoning(layout.items, dict.fromkeys(_origins(message)))
            for call in () if untouched else calls:
                original = layout.items[call[ORIGIN]]
                if item_type(original) != COMPUTER_CALL:
                    continue
                # A cut action object goes back cut, as a shell's does; a cut batch cannot.
                batch = not isinstance(original.get("action"), dict)
                if lost or (batch and call["function"]["arguments"] != call_arguments(original)):
                    changed.add(call[ORIGIN])
        if message.get("role") == "tool" and ORIGIN in message:
            original = layout.items[message[ORIGIN]]
            index = run.get(message.get("tool_call_id"))
            if item_type(original) == "computer_call_output" and index is not None:
                screenshots[index] = (message[ORIGIN], message.get("content"))
                if not untouched and message.get("content") != output_content(original):
                    changed.add(index)
    converted = _Converted()
    for index in changed:
        output, content = screenshots.get(index, (None, None))
        converted.shown[index] = _parts(content)
        if output is not None:
            converted.outputs.add(output)
    return converted


def _origins(message: Message) -> Iterator[int]:
    """The indices of the items a run message still holds (its parts' and its calls')."""
    content = message.get("content")
    for part in content if isinstance(content, list) else ():
        origin = part.get(ORIGIN) if isinstance(part, Mapping) else None
        if isinstance(origin, int | tuple):
            yield origin if isinstance(origin, int) else origin[0]
    for call in message.get("tool_calls") or ():
        yield call[ORIGIN]


def _parts(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    return [part for part in content if isinstance(part, Mapping)] if isinstance(content, list) else []


def _computer_call_as_text(arguments: object, shown: Sequence[Any]) -> dict[str, Any]:
    """A changed computer step as an assistant's text: the action, then what stands for its
    screenshot (one kept whole follows the run's outputs as a user's image: `_screenshots`)."""
    texts = [str(part.get("text", "")) for part in shown if part.get("type") == "input_text"]
    lines = [f"[called {CALLS[COMPUTER_CALL].name} with {arguments}]", *texts]
    return {"role": "assistant", "content": "\n".join(lines)}


def _screenshots(shown: Sequence[Any] | None) -> dict[str, Any] | None:
    """A converted step's screenshot kept whole, as a user message's image (None: it was not)."""
    images = [part for part in shown or () if part.get("type") != "input_text"]
    return {"role": "user", "content": images} if images else None


def _rebuild(
    originals: Sequence[Any], message: Message, as_text: Mapping[int, Sequence[Any]] | None = None
) -> list[Any]:
    """The items a changed run or output message stands for, with only what changed replaced
    (a computer call in `as_text`, by item index, as text: `_computer_steps_changed`)."""
    if message.get("role") == "tool":
        original = originals[message[ORIGIN]]
        return [{**original, "output": _output_value(original, message.get("content"))}]
    pieces: dict[int, Any] = {}
    texts: dict[int, list[Any]] = {}
    string_content: set[int] = set()
    content = message.get("content")
    for part in content if isinstance(content, list) else ():
        origin = part.get(ORIGIN) if isinstance(part, Mapping) else None
        if isinstance(origin, int):
            pieces[origin] = originals[origin]
        elif isinstance(origin, tuple):
            i, j = origin
            bare = {key: value for key, value in part.items() if key != ORIGIN}
            texts.setdefault(i, []).append(bare)
            if j == -1:
                string_content.add(i)
        # An untagged part is compress's "[reasoning omitted …]" trace (stage 1 emptied the run's
        # content): the reasoning items it stands for are gone, and it is no item of its own.
    for i, parts in texts.items():
        if i in string_content:
            pieces[i] = {**originals[i], "content": "".join(str(part.get("text", "")) for part in parts)}
        else:
            pieces[i] = {**originals[i], "content": parts}
    as_items: dict[int, Any] = {}
    for call in message.get("tool_calls") or ():
        i = call[ORIGIN]
        original = originals[i]
        arguments = call["function"]["arguments"]
        if as_text and i in as_text:
            as_items[i] = _computer_call_as_text(arguments, as_text[i])
            continue
        key = CALLS[str(item_type(original))].arguments
        changed = arguments != call_arguments(original)
        pieces[i] = {**original, key: _arguments_value(original.get(key), arguments)} if changed else original
    if as_items and not any(_keeps_its_id(item) for item in pieces.values()):
        # What the reasoning was kept for went as text: a reasoning item is refused without the
        # item it produced.
        pieces = {i: item for i, item in pieces.items() if not _is_reasoning(item)}
    if _lost_reasoning(originals, {**pieces, **as_items}):
        pieces = {i: _without_id(item) for i, item in pieces.items()}
    return [as_items[i] if i in as_items else pieces[i] for i in sorted({*pieces, *as_items})]


def _keeps_its_id(item: object) -> bool:
    """An item that goes on with its id, so with its reasoning: a pinning one, or a computer call."""
    return _needs_its_reasoning(item) or (isinstance(item, Mapping) and item_type(item) == COMPUTER_CALL)


def _needs_its_reasoning(item: object) -> bool:
    """An item with an id it cannot go without (a local shell or computer-use call, a server-run
    tool's call): the reasoning of its run is never dropped apart from it."""
    return isinstance(item, Mapping) and "id" in item and item_type(item) not in UNPINNED


def _in_run(item: object) -> bool:
    """Whether the item belongs to a run of model-side items: neither a user-side message nor an
    output answering a call (anything else, even an item that is no object, is the model's)."""
    return not _user_side(item) and not (isinstance(item, Mapping) and item_type(item) in OUTPUT_TYPES)


def _lost_reasoning(originals: Sequence[Any], kept: Mapping[int, Any]) -> bool:
    """Whether compress dropped a reasoning item of the run whose items are `kept` (a run: the
    longest stretch of model-side items around them)."""
    if not kept:
        return False
    first, last = min(kept), max(kept)
    while first > 0 and _in_run(originals[first - 1]):
        first -= 1
    while last + 1 < len(originals) and _in_run(originals[last + 1]):
        last += 1
    return any(i not in kept and _is_reasoning(originals[i]) for i in range(first, last + 1))


def _is_reasoning(item: object) -> bool:
    return isinstance(item, Mapping) and item_type(item) == "reasoning"


def _without_id(item: Any) -> Any:
    if isinstance(item, Mapping) and "id" in item and item_type(item) in REASONED_ID_OPTIONAL:
        return {key: value for key, value in item.items() if key != "id"}
    return item


def _output_value(original: Mapping[str, Any], content: Any) -> Any:
    """A changed result in its output item's shape: a shell output's as one chunk. (A computer
    call's screenshot only comes here unchanged: a changed one goes as text.)"""
    if item_type(original) == "computer_call_output":
        return original.get("output")
    if item_type(original) != "shell_call_output":
        return content
    chunks = original.get("output")
    last = chunks[-1] if isinstance(chunks, list) and chunks else None
    outcome = last.get("outcome") if isinstance(last, Mapping) else None
    text = content if isinstance(content, str) else str(content)
    return [{"stdout": text, "stderr": "", "outcome": outcome or {"type": "exit", "exit_code": 0}}]


def _arguments_value(original: Any, arguments: Any) -> Any:
    """Cut arguments in the call's own shape. An object (a built-in tool's action) takes back
    only the members it had, each cut to the same kind of value, so it stays what the API
    accepts. A member the cut left out (the longest ones: `call_arguments`) goes empty, smaller
    than the count of them it was weighed as, unless it is a word (`ENUM_CHARS`: a kind such as
    `exec` or `update_file`, which the API checks), a number or a flag, which stay. Arguments that
    no longer read as an object leave it as it was."""
    if isinstance(original, str) or not isinstance(arguments, str):
        return arguments
    try:
        cut = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return original
    if not (isinstance(original, dict) and isinstance(cut, dict)):
        return original

    def member(name: str, value: Any) -> Any:
        if name in cut and type(cut[name]) is type(value):
            return cut[name]
        if isinstance(value, str) and len(value) <= ENUM_CHARS:
            return value
        return type(value)() if isinstance(value, str | list | dict) else value

    return {name: member(name, value) for name, value in original.items()}


RESPONSES = ResponsesInput()
# The route's: its bodies' items come from the parse, shared between requests and never mutated.
SERVED_RESPONSES = ResponsesInput(Conversions())
