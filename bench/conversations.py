"""Deterministic, realistic conversations with planted canaries, for bench/quality.py.

Every conversation is generated from a seed (random.Random, no global state)
and carries five canaries, unique codes that should survive compression:
a rule in the system prompt, a fact in an early user turn, a fact in a
middle assistant turn, a fact inside an old tool result (placed in its
middle, where head/tail trimming loses it) and the latest user instruction.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import orjson

Message = dict[str, Any]
KINDS = ("system_rule", "early_user", "middle_assistant", "old_tool_result", "latest_instruction")


@dataclass(frozen=True)
class Conversation:
    name: str
    messages: list[Message]
    canaries: dict[str, str]  # kind -> code that must appear in the prompt


NOUNS = ["invoice", "cache", "worker", "session", "payload", "schema", "token", "queue", "report", "index"]
VERBS = ["validates", "retries", "serialises", "loads", "merges", "flushes", "parses", "renders"]
ADJS = ["stale", "nested", "pending", "optional", "duplicate", "remote", "legacy", "cached"]
ZH = [
    "我们",
    "需要",
    "检查",
    "这个",
    "配置",
    "文件",
    "因为",
    "部署",
    "失败",
    "了",
    "用户",
    "反馈",
    "订单",
    "服务器",
    "日志",
    "显示",
    "超时",
    "然后",
    "重新",
    "启动",
    "问题",
    "已经",
    "解决",
    "数据库",
    "连接",
]


def _code(rng: random.Random, prefix: str) -> str:
    return f"{prefix}-{rng.randrange(10_000, 99_999)}{rng.choice('ABCDEFGHJKLMNPQRSTUVWXYZ')}"


def sentence(rng: random.Random) -> str:
    n = rng.choice(NOUNS)
    return (
        f"The {rng.choice(ADJS)} {n} {rng.choice(VERBS)} the {rng.choice(NOUNS)} "
        f"before the {rng.choice(ADJS)} {rng.choice(NOUNS)} is {rng.choice(['ready', 'sent', 'closed'])}."
    )


def prose(rng: random.Random, tokens: int) -> str:
    out: list[str] = []
    while len(out) * 16 < tokens:
        out.append(sentence(rng))
        if rng.random() < 0.15:
            out.append("\n\n")
    return " ".join(out)


def chinese(rng: random.Random, tokens: int) -> str:
    out: list[str] = []
    while len(out) < tokens:
        out.append(rng.choice(ZH))
        if rng.random() < 0.12:
            out.append(rng.choice("，。"))
    return "".join(out) + "。"


def code_file(rng: random.Random, tokens: int, fact: str | None) -> str:
    lines: list[str] = []
    while len(lines) * 11 < tokens:
        name = f"{rng.choice(VERBS).rstrip('s')}_{rng.choice(NOUNS)}_{rng.randrange(100)}"
        lines += [
            f"def {name}(self, {rng.choice(NOUNS)}, retries={rng.randrange(1, 9)}):",
            f'    """{sentence(rng)}"""',
            f"    value = self.{rng.choice(NOUNS)}.get({rng.randrange(1000)})",
            f"    if value is None or value > {rng.randrange(10_000)}:",
            f"        return self.{rng.choice(VERBS).rstrip('s')}(value)",
            "    return value",
            "",
        ]
    if fact is not None:
        lines.insert(len(lines) // 2, f'FEATURE_SALT = "{fact}"  # rotated by ops, do not change')
    return "\n".join(lines)


def test_log(rng: random.Random, tokens: int, fact: str | None) -> str:
    lines = ["============================= test session starts =============================="]
    i = 0
    while len(lines) * 20 < tokens:
        i += 1
        module = f"tests/test_{rng.choice(NOUNS)}_{i % 37}.py"
        lines.append(f"{module}::test_{rng.choice(VERBS)}_{rng.choice(NOUNS)}_{i} PASSED [{i % 100:3d}%]")
        if rng.random() < 0.05:
            lines.append(f"  {rng.choice(NOUNS)}.py:{rng.randrange(900)}: DeprecationWarning: use new API")
    if fact is not None:
        lines.insert(len(lines) // 2, f"INFO fixture database seeded with tenant {fact}")
    lines.append(
        f"==================== {i} passed, {rng.randrange(9)} warnings in 41.20s ===================="
    )
    return "\n".join(lines)


def json_answer(rng: random.Random, tokens: int, fact: str | None) -> str:
    items = []
    while len(items) * 45 < tokens:
        items.append(
            {
                "id": rng.randrange(10**6),
                "status": rng.choice(["open", "closed", "pending"]),
                "owner": f"user{rng.randrange(500)}",
                "summary": sentence(rng),
                "amount": round(rng.random() * 1000, 2),
            }
        )
    if fact is not None:
        items[len(items) // 2]["internal_note"] = f"refund approved under case {fact}"
    return orjson.dumps(
        {"data": items, "count": len(items), "next_page": None}, option=orjson.OPT_INDENT_2
    ).decode()


TOOLS = {"read_file": code_file, "run_tests": test_log, "http_get": json_answer}


def _tool_round(rng: random.Random, style: str, turn: int, fact: str | None, scale: float) -> list[Message]:
    calls = []
    for k in range(rng.choice([1, 1, 1, 2])):
        tool = rng.choice(list(TOOLS))
        size = int(rng.randint(2_000, 20_000) * scale)
        calls.append(
            (
                f"call_{turn}_{k}_{rng.randrange(10**6)}",
                tool,
                TOOLS[tool](rng, size, fact if k == 0 else None),
            )
        )
    if style == "anthropic":
        blocks = [
            {"type": "tool_use", "id": i, "name": t, "input": {"path": f"src/{t}.py"}} for i, t, _ in calls
        ]
        results = [{"type": "tool_result", "tool_use_id": i, "content": out} for i, _, out in calls]
        return [{"role": "assistant", "content": blocks}, {"role": "user", "content": results}]
    assistant: Message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": i,
                "type": "function",
                "function": {"name": t, "arguments": orjson.dumps({"path": t}).decode()},
            }
            for i, t, _ in calls
        ],
    }
    return [assistant, *({"role": "tool", "tool_call_id": i, "content": out} for i, _, out in calls)]


def _finish(name: str, messages: list[Message], canaries: dict[str, str], rng: random.Random) -> Conversation:
    code = _code(rng, "INSTR")
    messages.append({"role": "user", "content": f"Next step ({code}): {sentence(rng)} Please go ahead."})
    canaries["latest_instruction"] = code
    return Conversation(name, messages, canaries)


def conversation(kind: str, seed: int, turns: int | None = None, scale: float = 1.0) -> Conversation:
    """kind: agent | support | bilingual | multimodal | reasoning (~250k tokens for an agent)."""
    if turns is None:
        turns = 10 if kind == "agent" else 24
    rng = random.Random(f"{kind}-{seed}")
    canaries = {k: _code(rng, k[:4].upper()) for k in KINDS[:4]}
    style = "anthropic" if kind == "agent" and seed % 2 else "openai"
    system = f"You are a careful assistant. Rule: every answer must cite policy {canaries['system_rule']}."
    messages: list[Message] = [{"role": "system", "content": system + " " + prose(rng, 300)}]
    tool_turn = max(1, turns // 3)
    for turn in range(turns):
        text = prose(rng, rng.randint(30, 200))
        if kind == "bilingual" and turn % 2:
            text = chinese(rng, rng.randint(40, 300))
        if turn == 1:
            text += f" For the record, my account reference is {canaries['early_user']}."
        if kind == "multimodal" and turn % 3 == 0:
            url = f"https://example.com/screenshots/{seed}-{turn}.png"
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": text},
                        {"type": "image_url", "image_url": {"url": url}},
                    ],
                }
            )
        else:
            messages.append({"role": "user", "content": text})
        rounds = rng.randint(1, 4) if kind == "agent" else int(rng.random() < 0.25)
        for r in range(rounds):
            fact = canaries["old_tool_result"] if turn == tool_turn and r == 0 else None
            messages += _tool_round(rng, style, turn, fact, scale if kind == "agent" else 0.3 * scale)
        if rounds == 0 and turn == tool_turn:  # the tool fact is planted in every kind
            messages += _tool_round(rng, style, turn, canaries["old_tool_result"], 0.3 * scale)
        reply = prose(rng, rng.randint(80, 600))
        if kind == "bilingual" and turn % 2:
            reply = chinese(rng, rng.randint(80, 700))
        if turn == turns // 2:
            reply = (
                prose(rng, 200)
                + f" Noted: the agreed rollout window is {canaries['middle_assistant']}. "
                + prose(rng, 200)
            )
        message: Message = {"role": "assistant", "content": reply}
        if kind == "reasoning":
            message["reasoning_content"] = prose(rng, rng.randint(500, 3_000))
        messages.append(message)
    return _finish(kind, messages, canaries, rng)


def growing(seed: int, turns: int = 60, agent_loop: bool = False) -> list[list[Message]]:
    """Request bodies of a conversation growing turn by turn (each ends with a user message).

    agent_loop: also the requests an agent sends within a turn, after each
    round of tool results (the latest turn then holds them at full size).
    """
    full = conversation("agent", seed, turns=turns, scale=0.1).messages
    if not agent_loop:
        return [
            full[: i + 1] for i, m in enumerate(full) if m["role"] == "user" and isinstance(m["content"], str)
        ]
    requests = []
    for i, message in enumerate(full[1:], start=1):
        following = full[i + 1]["role"] if i + 1 < len(full) else None
        results = message["role"] == "tool" or (
            message["role"] == "user" and not isinstance(message["content"], str)
        )
        if (message["role"] == "user" and isinstance(message["content"], str)) or (
            results and following not in ("tool",)
        ):
            requests.append(full[: i + 1])
    return requests


def huge(seed: int, tokens: int) -> list[Message]:
    """An agent conversation of about `tokens` tokens."""
    return conversation("agent", seed, turns=max(2, tokens // 33_000)).messages


def grep_hits(rng: random.Random, tokens: int, fact: str | None) -> str:
    lines: list[str] = []
    while len(lines) * 18 < tokens:
        path = f"src/{rng.choice(NOUNS)}/{rng.choice(VERBS).rstrip('s')}_{rng.choice(NOUNS)}.py"
        lines.append(
            f"{path}:{rng.randrange(1, 900)}:    self.{rng.choice(NOUNS)} = {rng.choice(ADJS)}_value"
        )
    if fact is not None:
        lines.insert(len(lines) // 2, f"src/ops/keys.py:12:ROTATION_ID = '{fact}'")
    return "\n".join(lines)


LOOP_TOOLS = {"read_file": code_file, "run_tests": test_log, "grep": grep_hits, "http_get": json_answer}


@dataclass(frozen=True)
class AgentLoop:
    """One user task answered by many tool steps, in one wire format."""

    name: str
    messages: list[Message]
    task: str  # a code in the latest user message
    step_starts: list[int]  # index of each step's assistant message
    call_ids: list[str]  # every tool call of the loop, in order


def _step_size(rng: random.Random) -> int:
    """Tool output sizes of a working agent: mostly small, sometimes a whole file or log."""
    return int(min(12_000, max(40, rng.lognormvariate(6.3, 1.1))))


def agent_loop(seed: int, steps: int, style: str, prior_turns: int = 0) -> AgentLoop:
    """A task followed by `steps` tool steps (about 1–2k tokens each), after `prior_turns` chat turns."""
    rng = random.Random(f"loop-{style}-{seed}-{steps}")
    messages: list[Message] = [
        {"role": "system", "content": "You are a coding agent. Use the tools. " + prose(rng, 200)}
    ]
    for turn in range(prior_turns):
        messages.append({"role": "user", "content": prose(rng, rng.randint(30, 200))})
        messages += _tool_round(rng, style, turn, None, 0.2)
        messages.append({"role": "assistant", "content": prose(rng, rng.randint(80, 400))})
    task = _code(rng, "TASK")
    text = f"Task {task}: {sentence(rng)} {prose(rng, rng.randint(40, 300))}"
    messages.append(
        {"role": "user", "content": [{"type": "text", "text": text}] if style == "anthropic" else text}
    )
    starts: list[int] = []
    ids: list[str] = []
    for step in range(steps):
        starts.append(len(messages))
        calls = []
        for k in range(rng.choice([1, 1, 1, 1, 2, 3])):
            tool = rng.choice(list(LOOP_TOOLS))
            call_id = f"call_{seed}_{step}_{k}_{rng.randrange(10**6)}"
            output = LOOP_TOOLS[tool](rng, _step_size(rng), None)
            calls.append((call_id, tool, f"[{call_id}]\n{output}"))
            ids.append(call_id)
        note = sentence(rng) if rng.random() < 0.4 else None
        arguments = {"path": f"src/{rng.choice(NOUNS)}.py", "query": rng.choice(NOUNS)}
        if style == "anthropic":
            blocks: list[Message] = [{"type": "text", "text": note}] if note else []
            if rng.random() < 0.3:
                blocks.insert(
                    0, {"type": "thinking", "thinking": prose(rng, rng.randint(50, 400)), "signature": "s"}
                )
            blocks += [{"type": "tool_use", "id": i, "name": t, "input": arguments} for i, t, _ in calls]
            results = [{"type": "tool_result", "tool_use_id": i, "content": out} for i, _, out in calls]
            messages += [{"role": "assistant", "content": blocks}, {"role": "user", "content": results}]
        else:
            assistant: Message = {
                "role": "assistant",
                "content": note,
                "tool_calls": [
                    {
                        "id": i,
                        "type": "function",
                        "function": {"name": t, "arguments": orjson.dumps(arguments).decode()},
                    }
                    for i, t, _ in calls
                ],
            }
            messages += [
                assistant,
                *({"role": "tool", "tool_call_id": i, "content": out} for i, _, out in calls),
            ]
    return AgentLoop(f"loop-{style}-{steps}", messages, task, starts, ids)


def loop_requests(loop: AgentLoop) -> list[list[Message]]:
    """The requests an agent sends: after its task, then after every step's results."""
    ends = [*loop.step_starts[1:], len(loop.messages)]
    return [loop.messages[: loop.step_starts[0]]] + [loop.messages[:end] for end in ends]


@dataclass(frozen=True)
class Stated:
    """A conversation with facts planted the way users state them (bench/quality.py --digest).

    `kept` are codes that should survive; `stale` is a value the user later
    corrected (to `kept["corrected"]`), which should not reach the model without it.
    """

    name: str
    messages: list[Message]
    kept: dict[str, str]
    stale: str


STATED_KINDS = ("rule", "preference", "deadline", "corrected", "decision", "tool_error")


def stated(kind: str, seed: int, turns: int = 24) -> Stated:
    """A generated conversation (`conversation`) with rules and preferences stated early, a value
    stated and later corrected, a decision taken mid-way and an error met in a tool result.

    Each statement sits inside a longer user (or assistant) message, as people write; in the
    bilingual kind the user states them in Chinese, with no spaces between words.
    """
    base = conversation(kind, seed, turns=turns)
    rng = random.Random(f"stated-{kind}-{seed}")
    codes = {k: _code(rng, k[:4].upper()) for k in STATED_KINDS}
    stale = _code(rng, "CORR")
    zh = kind == "bilingual"
    said = {
        "rule": f"永远不要修改 {codes['rule']} 集群的配置。"
        if zh
        else f"Never touch the {codes['rule']} cluster.",
        "preference": f"我希望所有回答都引用工单 {codes['preference']}。"
        if zh
        else f"I prefer that every answer cites ticket {codes['preference']}.",
        "deadline": f"截止日期是 {codes['deadline']}，必须在此之前完成。"
        if zh
        else f"The deadline is {codes['deadline']}, we must ship before it.",
        "original": f"发布分支是 {stale}。" if zh else f"The release branch is {stale}.",
        "corrected": f"更正：发布分支是 {codes['corrected']}。"
        if zh
        else f"Correction: the release branch is {codes['corrected']}.",
    }
    messages = [dict(m) for m in base.messages]
    users = [i for i, m in enumerate(messages) if m["role"] == "user" and isinstance(m["content"], str)]
    assistants = [
        i for i, m in enumerate(messages) if m["role"] == "assistant" and isinstance(m["content"], str)
    ]

    def plant(index: int, text: str) -> None:
        words = messages[index]["content"].split(". ")
        middle = len(words) // 2
        messages[index]["content"] = ". ".join([*words[:middle], text.rstrip("."), *words[middle:]])

    plant(users[1], said["rule"])
    plant(users[3], said["preference"])
    plant(users[5], said["deadline"])
    plant(users[6], said["original"])
    plant(users[len(users) * 3 // 5], said["corrected"])
    plant(assistants[len(assistants) // 2], f"We decided to go with the {codes['decision']} approach.")
    calls = [i for i, m in enumerate(messages) if m["role"] == "tool"]
    if calls:
        index = calls[len(calls) // 2]
        messages[index]["content"] = (
            str(messages[index]["content"]) + f"\nError: connection refused by {codes['tool_error']}\n"
        )
    else:
        codes.pop("tool_error")
    return Stated(kind, messages, codes, stale)


# Shapes for the scaling table (bench/quality.py --scaling): sizes far past any budget, where
# only the work per message or per character shows.


def chatter(seed: int, messages: int) -> list[Message]:
    """A system prompt and `messages` short user/assistant messages (a chat bot's long history)."""
    rng = random.Random(seed)
    out: list[Message] = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(messages):
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": sentence(rng)})
    if out[-1]["role"] != "user":
        out.append({"role": "user", "content": "And now?"})
    return out


def tiny_steps(seed: int, steps: int) -> list[Message]:
    """One task answered by `steps` tiny tool steps (an agent polling or listing in a loop)."""
    rng = random.Random(seed)
    out: list[Message] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Find the stale worker and fix it."},
    ]
    for i in range(steps):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "read_file", "arguments": orjson.dumps({"path": f"src/{i}.py"}).decode()},
        }
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        out.append({"role": "tool", "tool_call_id": f"call_{i}", "content": sentence(rng)})
    return out


def one_line(seed: int, megabytes: float) -> list[Message]:
    """A system prompt and one user message of `megabytes` of text on one line, without sentence ends
    (a pasted minified file or log): the text is split into pieces at spaces."""
    rng = random.Random(seed)
    words: list[str] = []
    size = 0
    while size < megabytes * 1_000_000:
        word = f"{rng.choice(ADJS)}_{rng.choice(NOUNS)}={rng.randrange(1000)}"
        words.append(word)
        size += len(word) + 1
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": " ".join(words)},
    ]
