"""How each part of a chat-completions request turns into prompt tokens.

Pure rules, parameterised by a text counter (one tokenizer) and a model
profile; `counter.py` adds caching and the approximation factor on top.

Documented by OpenAI (cookbook "How to count tokens with tiktoken"):

- every message costs 3 tokens of framing plus the tokens of each of its
  string values (role, content, name, …); a `name` costs 1 more; every reply
  is primed with 3 tokens (`<|start|>assistant<|message|>`);
- function definitions (`num_tokens_for_tools`): 7 tokens per function (10
  for cl100k models), the tokens of `name:description` (one trailing period
  dropped), 3 when the parameters have properties, 3 per property plus the
  tokens of `key:type:description`, −3 per enum plus 3 and the item's tokens
  per enum item, and 12 once after the last function.

Our conventions where OpenAI documents nothing (each one errs on the side of
counting more, never less):

- an assistant tool call (`tool_calls[]`, legacy `function_call`, Anthropic
  `tool_use`/`tool_result` blocks) costs 3 framing tokens like a message,
  plus its id, type, function name and arguments (`tool_use.input` as compact
  JSON);
- text parts count their text; images, audio and files count as described in
  `images.py` and `media.py`; `thinking` blocks count their text;
- nested schema keywords the cookbook does not cover (`items`, nested
  `properties`, `anyOf`, `$defs`, …) count as their compact JSON, as do
  non-function tools, the `response_format` JSON schema, unknown message
  fields and unknown part types;
- numbers, booleans and nulls on a message are flags (DeepSeek's `prefix`),
  not prompt text: not counted. Non-string enum items are written without
  quotes, so they cost 1 framing token instead of 3.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import orjson

from gateway.tokens.encodings import ModelProfile
from gateway.tokens.images import base64_image_size, data_url_image_size
from gateway.tokens.media import audio_tokens, pdf_pages, pdf_tokens
from gateway.tokens.payloads import split_data_url

TOKENS_PER_MESSAGE: Final = 3
TOKENS_PER_NAME: Final = 1
REPLY_PRIMING: Final = 3
TOKENS_PER_TOOL_CALL: Final = 3

PROP_INIT: Final = 3
PROP_KEY: Final = 3
ENUM_INIT: Final = -3
ENUM_ITEM: Final = 3
NON_STRING_ENUM_ITEM: Final = 1
FUNC_END: Final = 12

# Keywords the cookbook's line format already renders (or that render as
# nothing: `required` only marks a property optional, `additionalProperties`
# is enforced, not shown).
_RENDERED_PARAMETER_KEYS: Final = frozenset({"type", "properties", "required", "additionalProperties"})
_RENDERED_PROPERTY_KEYS: Final = frozenset({"type", "description", "enum"})

TextCounter = Callable[[str], int]


class NestedTooDeeply(ValueError):
    """A value nested past the recursion limit: neither JSON nor a repr of it can be written."""


def compact_json(value: object, *, sort_keys: bool = False) -> str:
    """`value` as compact JSON, whatever it holds: what orjson refuses (lone surrogates, non-string
    keys, more than 254 levels) goes through `json`, and what that refuses too (keys it cannot
    write or sort) as its repr. Nesting past the recursion limit raises NestedTooDeeply: the repr
    recurses as deep, and no stand-in text would count or key the value truly."""
    try:
        return orjson.dumps(value, default=str, option=orjson.OPT_SORT_KEYS if sort_keys else 0).decode()
    except TypeError:
        pass
    try:
        try:
            return json.dumps(
                value, default=str, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys
            )
        except (TypeError, ValueError):
            return repr(value)
    except RecursionError:
        raise NestedTooDeeply("a value nests too deeply to write as JSON") from None


class PromptRules:
    """Raw token counts (before any approximation factor) for one model profile."""

    __slots__ = ("_text", "profile")

    def __init__(self, profile: ModelProfile, text: TextCounter) -> None:
        self.profile = profile
        self._text = text

    # --- messages ---------------------------------------------------------

    def message(self, message: Mapping[str, Any]) -> int:
        total = TOKENS_PER_MESSAGE
        for key, value in message.items():
            if key == "content":
                total += self._content(value)
            elif key == "tool_calls" and isinstance(value, list):
                total += sum(self._call(call) for call in value)
            elif key == "function_call" and isinstance(value, Mapping):
                total += self._call(value)
            elif key == "name" and isinstance(value, str):
                total += self._text(value) + TOKENS_PER_NAME
            else:
                total += self._value(value)
        return total

    def _content(self, content: object) -> int:
        if isinstance(content, str):
            return self._text(content)
        if isinstance(content, list):
            return sum(self._part(part) for part in content)
        if isinstance(content, Mapping):
            return self._part(content)
        return 0

    def _part(self, part: object) -> int:
        if isinstance(part, str):
            return self._text(part)
        if not isinstance(part, Mapping):
            return self._json(part)
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text"):
            return self._string(part.get("text"))
        if kind == "image_url":
            return self._image_url(part.get("image_url"))
        if kind == "input_image":  # Responses: the URL and detail sit on the part itself
            return self._image_url(
                {"url": part.get("image_url") or "", "detail": part.get("detail") or "auto"}
            )
        if kind == "input_file":
            return self._file(part)
        if kind == "image":
            return self._anthropic_image(part.get("source"))
        if kind == "input_audio":
            return self._audio(part.get("input_audio"))
        if kind == "file":
            return self._file(part.get("file"))
        if kind == "document":
            return self._document(part)
        if kind == "refusal":
            return self._string(part.get("refusal"))
        if kind == "thinking":
            return self._string(part.get("thinking"))
        if kind == "tool_use":
            return (
                TOKENS_PER_TOOL_CALL
                + self._string(part.get("id"))
                + self._string(part.get("name"))
                + self._value(part.get("input"))
            )
        if kind == "tool_result":
            tool_use_id = self._string(part.get("tool_use_id"))
            return TOKENS_PER_TOOL_CALL + tool_use_id + self._content(part.get("content"))
        return self._json(part)

    def _call(self, call: object) -> int:
        """An OpenAI tool call (`id`, `type`, `function: {name, arguments}`) or legacy function_call."""
        if not isinstance(call, Mapping):
            return self._json(call)
        total = TOKENS_PER_TOOL_CALL
        for value in call.values():
            if isinstance(value, Mapping):  # `function: {name, arguments}`
                total += sum(self._value(inner) for inner in value.values())
            else:
                total += self._value(value)
        return total

    # --- attachments ------------------------------------------------------

    def _image_url(self, image_url: object) -> int:
        if isinstance(image_url, str):
            url, detail = image_url, "auto"
        elif isinstance(image_url, Mapping):
            url, detail = str(image_url.get("url") or ""), str(image_url.get("detail") or "auto")
        else:
            url, detail = "", "auto"
        return self.profile.image.tokens(data_url_image_size(url), detail)

    def _anthropic_image(self, source: object) -> int:
        size = None
        if isinstance(source, Mapping):
            if source.get("type") == "base64" and isinstance(source.get("data"), str):
                size = base64_image_size(source["data"])
            elif isinstance(source.get("url"), str):
                size = data_url_image_size(source["url"])
        return self.profile.image.tokens(size, "auto")

    def _audio(self, audio: object) -> int:
        if not isinstance(audio, Mapping) or not isinstance(audio.get("data"), str):
            return 0
        return audio_tokens(audio["data"], str(audio.get("format") or ""))

    def _file(self, file: object) -> int:
        if not isinstance(file, Mapping):
            return self._pdf(None)
        data = file.get("file_data")
        payload = None
        if isinstance(data, str):
            parts = split_data_url(data)
            payload = parts[1] if parts is not None else data
        return self._string(file.get("filename")) + self._pdf(payload)

    def _document(self, block: Mapping[str, Any]) -> int:
        total = self._string(block.get("title")) + self._string(block.get("context"))
        source = block.get("source")
        if not isinstance(source, Mapping):
            return total + self._pdf(None)
        kind = source.get("type")
        if kind == "text":
            return total + self._string(source.get("data"))
        if kind == "content":
            return total + self._content(source.get("content"))
        data = source.get("data")
        return total + self._pdf(data if kind == "base64" and isinstance(data, str) else None)

    def _pdf(self, payload: str | None) -> int:
        pages = 1 if payload is None else pdf_pages(payload)
        return pdf_tokens(pages, self.profile.image.maximum())

    # --- request-level definitions ----------------------------------------

    def tools(self, tools: Sequence[Any] | None, functions: Sequence[Any] | None = None) -> int:
        if not tools and not functions:
            return 0
        total = FUNC_END
        for tool in tools or ():
            is_function = isinstance(tool, Mapping) and tool.get("type") == "function"
            function = tool.get("function") if is_function else None
            if isinstance(function, Mapping):
                total += self._function(function)
            else:
                total += self.profile.func_init + self._json(tool)
        for function in functions or ():
            if isinstance(function, Mapping):
                total += self._function(function)
            else:
                total += self.profile.func_init + self._json(function)
        return total

    def _function(self, function: Mapping[str, Any]) -> int:
        name = str(function.get("name") or "")
        description = str(function.get("description") or "").removesuffix(".")
        total = self.profile.func_init + self._text(f"{name}:{description}")
        parameters = function.get("parameters")
        if not isinstance(parameters, Mapping):
            return total
        properties = parameters.get("properties")
        if isinstance(properties, Mapping) and properties:
            total += PROP_INIT
            for key, schema in properties.items():
                total += self._property(str(key), schema if isinstance(schema, Mapping) else {})
        return total + self._extras(parameters, _RENDERED_PARAMETER_KEYS)

    def _property(self, name: str, schema: Mapping[str, Any]) -> int:
        total = PROP_KEY
        enum = schema.get("enum")
        if isinstance(enum, list):
            total += ENUM_INIT
            for item in enum:
                if isinstance(item, str):
                    total += ENUM_ITEM + self._text(item)
                else:
                    total += NON_STRING_ENUM_ITEM + self._json(item)
        kind = schema.get("type")
        type_text = "|".join(map(str, kind)) if isinstance(kind, list) else str(kind or "")
        description = str(schema.get("description") or "").removesuffix(".")
        total += self._text(f"{name}:{type_text}:{description}")
        return total + self._extras(schema, _RENDERED_PROPERTY_KEYS)

    def _extras(self, schema: Mapping[str, Any], rendered: frozenset[str]) -> int:
        extras = {key: value for key, value in schema.items() if key not in rendered}
        return self._json(extras) if extras else 0

    def response_format(self, response_format: object) -> int:
        """A `json_schema` response format's schema; `text`/`json_object` add nothing."""
        if not isinstance(response_format, Mapping) or response_format.get("type") != "json_schema":
            return 0
        return self._value(response_format.get("json_schema"))

    # --- leaves -----------------------------------------------------------

    def _string(self, value: object) -> int:
        return self._text(value) if isinstance(value, str) else 0

    def _value(self, value: object) -> int:
        """Strings as text, structures as compact JSON, scalar flags as nothing."""
        if isinstance(value, str):
            return self._text(value)
        if isinstance(value, Mapping | list):
            return self._json(value)
        return 0

    def _json(self, value: object) -> int:
        return self._text(compact_json(value))
