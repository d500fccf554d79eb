"""The benchmark's chat conversations rewritten in Anthropic Messages and OpenAI Responses shapes.

Same content, each API's own structure: system prompt at the top level (`system`,
`instructions`), tool calls as `tool_use`/`tool_result` blocks or `function_call` /
`function_call_output` items, reasoning as signed `thinking` blocks or `reasoning` items,
images as `image` blocks or `input_image` parts. Conversations already written with
Anthropic-style blocks keep them.
"""

from __future__ import annotations

from typing import Any

import orjson

from tests.fakes.anthropic_api import sign

Message = dict[str, Any]


def _arguments(call: Message) -> Any:
    try:
        value = orjson.loads(call["function"]["arguments"])
    except orjson.JSONDecodeError:
        return {"arguments": call["function"]["arguments"]}
    return value if isinstance(value, dict) else {"value": value}


def _anthropic_content(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    out = []
    for part in content:
        if part.get("type") == "image_url":
            out.append({"type": "image", "source": {"type": "url", "url": part["image_url"]["url"]}})
        else:
            out.append(part)
    return out


def to_anthropic(messages: list[Message], model: str, max_tokens: int = 1024) -> dict[str, Any]:
    system = "\n\n".join(m["content"] for m in messages if m["role"] in ("system", "developer"))
    out: list[Message] = []
    for message in messages:
        role = message["role"]
        if role in ("system", "developer"):
            continue
        if role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": message["tool_call_id"],
                "content": message["content"],
            }
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(result)
            else:
                out.append({"role": "user", "content": [result]})
            continue
        if role == "assistant" and not isinstance(message.get("content"), list):
            blocks: list[Message] = []
            if message.get("reasoning_content"):
                thought = message["reasoning_content"]
                blocks.append({"type": "thinking", "thinking": thought, "signature": sign(thought)})
            if message.get("content"):
                blocks.append({"type": "text", "text": message["content"]})
            for call in message.get("tool_calls") or ():
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": call["function"]["name"],
                        "input": _arguments(call),
                    }
                )
            out.append({"role": "assistant", "content": blocks})
            continue
        out.append({"role": role, "content": _anthropic_content(message["content"])})
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": out}
    if system:
        body["system"] = system
    return body


def _input_parts(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    out = []
    for part in content:
        if part.get("type") == "image_url":
            out.append({"type": "input_image", "image_url": part["image_url"]["url"]})
        elif part.get("type") == "text":
            out.append({"type": "input_text", "text": part["text"]})
        else:
            out.append(part)
    return out


def to_responses(messages: list[Message], model: str, max_output_tokens: int = 1024) -> dict[str, Any]:
    instructions = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    items: list[Message] = []
    for number, message in enumerate(messages):
        role = message["role"]
        content = message.get("content")
        if role == "system":
            continue
        if role == "tool":
            items.append(
                {"type": "function_call_output", "call_id": message["tool_call_id"], "output": content}
            )
        elif role == "assistant" and isinstance(content, list):  # Anthropic-style blocks
            for block in content:
                if block["type"] == "tool_use":
                    arguments = orjson.dumps(block["input"]).decode()
                    items.append(
                        {
                            "type": "function_call",
                            "call_id": block["id"],
                            "name": block["name"],
                            "arguments": arguments,
                        }
                    )
                elif block["type"] == "text":
                    items.append({"role": "assistant", "content": block["text"]})
        elif role == "assistant":
            if message.get("reasoning_content"):
                summary = [{"type": "summary_text", "text": message["reasoning_content"]}]
                items.append({"type": "reasoning", "id": f"rs_{number}", "summary": summary})
            if content:
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": content}],
                    }
                )
            for call in message.get("tool_calls") or ():
                function = call["function"]
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": function["name"],
                        "arguments": function["arguments"],
                    }
                )
        elif (
            role == "user"
            and isinstance(content, list)
            and content
            and content[0].get("type") == "tool_result"
        ):
            rest = [block for block in content if block.get("type") != "tool_result"]
            for block in content:
                if block.get("type") == "tool_result":
                    items.append(
                        {
                            "type": "function_call_output",
                            "call_id": block["tool_use_id"],
                            "output": block["content"],
                        }
                    )
            if rest:  # Claude Code sends a user's words (or a reminder) after the results they follow
                items.append({"role": role, "content": _input_parts(rest)})
        else:
            items.append({"role": role, "content": _input_parts(content)})
    body: dict[str, Any] = {"model": model, "input": items, "max_output_tokens": max_output_tokens}
    if instructions:
        body["instructions"] = instructions
    return body


def to_responses_shell(messages: list[Message], model: str) -> dict[str, Any]:
    """The Responses shape with every tool as the built-in `shell` a Codex-style agent runs: each
    call's arguments as its command, each result as what the command printed."""
    body = to_responses(messages, model)
    items: list[Message] = []
    for item in body["input"]:
        if item.get("type") == "function_call":
            action = {"commands": [item["arguments"]], "timeout_ms": 60_000}
            item = {"type": "shell_call", "call_id": item["call_id"], "action": action, "status": "completed"}
        elif item.get("type") == "function_call_output":
            output = item["output"]
            if not isinstance(output, str):
                output = "\n".join(str(part.get("text", "")) for part in output if isinstance(part, dict))
            chunk = {"stdout": output, "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}
            item = {"type": "shell_call_output", "call_id": item["call_id"], "output": [chunk]}
        items.append(item)
    return {**body, "input": items}


def to_responses_computer(messages: list[Message], model: str, screenshot: str) -> dict[str, Any]:
    """The Responses shape of a computer-use agent on a reasoning model: each call a reasoning item
    and a `computer_call` typing the call's arguments, each result the screenshot (a data URL) the
    client took after it (the result's text is not seen: a computer step shows a screen)."""
    body = to_responses(messages, model)
    items: list[Message] = []
    for item in body["input"]:
        if item.get("type") == "function_call":
            call_id = item["call_id"]
            items.append(
                {"type": "reasoning", "id": f"rs_{call_id}", "summary": [], "encrypted_content": "e" * 200}
            )
            action = {"type": "type", "text": item["arguments"]}
            item = {
                "type": "computer_call",
                "id": f"cu_{call_id}",
                "call_id": call_id,
                "action": action,
                "pending_safety_checks": [],
                "status": "completed",
            }
        elif item.get("type") == "function_call_output":
            shot = {"type": "computer_screenshot", "image_url": screenshot}
            item = {"type": "computer_call_output", "call_id": item["call_id"], "output": shot}
        items.append(item)
    return {**body, "input": items}
