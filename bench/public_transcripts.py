"""The public agent transcripts of the README's loop table, rebuilt from their repositories.

    python -m bench.public_transcripts --mini-swe-agent GIT_DIR --swe-agent GIT_DIR --out DIR
                                       [--tau-bench GIT_DIR]

Each GIT_DIR is a git directory (a clone's `.git`, or a bare mirror) holding the pinned
commit below; nothing is fetched. Writes one chat completions body per transcript into
DIR, and DIR/manifest.tsv (file, source, path, steps, tokens); then
`python -m bench.quality --only-loops --loops-from DIR` measures them. Earlier stops
picked their sets by hand and could not rebuild them, so their tables compared
different sets; this picks by rule, and the same commits give the same files.

- 8 runs of mini-swe-agent (Gemini 3 Pro on SWE-bench Verified) from the
  gruckion/mini-swe-agent fork's `swebench_results/`: of the runs where every reply
  holds exactly one bash block (an agent that calls one tool per step), sorted by
  steps then path, those at evenly spaced ranks, the shortest and longest included.
- 6 of SWE-agent's `trajectories/demonstrations/` (11–17 steps, their `history`): the
  four distinct CTF challenges of that length, and marshmallow-1867 in its two base
  formats (the command in a text block, and a native tool call).

- With --tau-bench, 8 of tau-bench's `historical_trajectories/gpt-4o-airline.json` (a
  customer-service agent: many user turns, JSON tool outputs, one call per step, call ids
  reused across steps as the run sent them). These are chat completions already: each is
  kept verbatim up to the request the agent sent after the last tool result of its user
  turn with the most tool steps (at least 3), which becomes the loop; picked as above by
  that turn's steps, then the entry's index.

A step becomes an assistant message (its thought as content, its command as one `bash`
tool call with an id of OpenAI's length, derived from the file and step) and a `tool`
message with the output verbatim. A last reply with no output after it is left out.
All three repositories are MIT-licensed; nothing of theirs is in this one.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from gateway.compress.units import is_user_input
from gateway.tokens.counter import counter_for

MODEL = "gpt-4o"
MINI_SWE_AGENT = ("gruckion/mini-swe-agent", "d12a71affd95403b036b2bdbd827349b77bfffb9")
MINI_SWE_AGENT_RUNS = "swebench_results/20251118_gemini-3-pro-74pct/trajs/"
MINI_SWE_AGENT_PICKS = 8
SWE_AGENT = ("SWE-agent/SWE-agent", "3ea751c087f32b16e039a2233dd6eefecef325d5")
SWE_AGENT_DEMOS = "trajectories/demonstrations/"
SWE_AGENT_PICKS = {
    "swea-ctf-babyencryption": "ctf/crypto/BabyEncryption.traj",
    "swea-ctf-eps": "ctf/crypto/eps.traj",
    "swea-ctf-katy": "ctf/crypto/katy.traj",
    "swea-ctf-rock": "ctf/rev/rock.traj",
    "swea-marshmallow-1867-default": "replay__marshmallow-code__marshmallow-1867__default__t-0.20__p-0.95"
    "__c-2.00__install-1___install_from_source/marshmallow-code__marshmallow-1867.traj",
    "swea-marshmallow-1867-function-calling": "replay__marshmallow-code__marshmallow-1867__function_calling"
    "__install-1/marshmallow-code__marshmallow-1867.traj",
}
TAU_BENCH = ("sierra-research/tau-bench", "59a200c6d575d595120f1cb70fea53cef0632f6b")
TAU_BENCH_RUNS = "historical_trajectories/gpt-4o-airline.json"
TAU_BENCH_PICKS = 8
TAU_BENCH_MIN_STEPS = 3
BASH_BLOCK = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)
ID_HEX_DIGITS = 24  # "call_" and 24 digits: the length of OpenAI's ids (the API takes at most 40)

Step = tuple[str, str, str]  # thought, command, output


class Repository:
    def __init__(self, git_dir: Path, commit: str) -> None:
        self.git_dir, self.commit = git_dir, commit

    def _git(self, *args: str) -> bytes:
        command = ["git", "--git-dir", str(self.git_dir), *args]
        return subprocess.run(command, check=True, capture_output=True).stdout

    def files(self, folder: str) -> list[str]:
        return sorted(self._git("ls-tree", "-r", "--name-only", self.commit, folder).decode().split())

    def json(self, path: str) -> Any:
        return orjson.loads(self._git("show", f"{self.commit}:{path}"))


def body(name: str, system: str, task: str, steps: list[Step]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": task},
    ]
    for index, (thought, command, output) in enumerate(steps):
        call_id = "call_" + hashlib.sha256(f"{name}.json{index}".encode()).hexdigest()[:ID_HEX_DIGITS]
        arguments = orjson.dumps({"command": command}).decode()
        call = {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": arguments}}
        messages.append({"role": "assistant", "content": thought, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
    return {"model": MODEL, "messages": messages}


def replies(conversation: list[dict[str, Any]], answered_by: tuple[str, ...]) -> Iterator[tuple[Any, Any]]:
    """Each reply after the system prompt and the task, with the message answering it (the next
    one, when its role is one of `answered_by`), or None."""
    rest = conversation[2:]
    for index, entry in enumerate(rest):
        if entry["role"] == "assistant":
            answer = rest[index + 1] if index + 1 < len(rest) else None
            yield entry, answer if answer is not None and answer["role"] in answered_by else None


def mini_swe_agent_steps(messages: list[dict[str, Any]]) -> list[Step] | None:
    """A run's steps, or None when a reply holds no bash block or several."""
    steps: list[Step] = []
    for message, answer in replies(messages, ("user",)):
        blocks = list(BASH_BLOCK.finditer(message["content"]))
        if len(blocks) != 1:
            return None
        if answer is None:
            break
        block, text = blocks[0], message["content"]
        thought = (text[: block.start()] + text[block.end() :]).strip()
        steps.append((thought, block.group(1), answer["content"]))
    return steps


def mini_swe_agent(repository: Repository) -> list[tuple[str, str, dict[str, Any], int]]:
    runs = []
    for path in repository.files(MINI_SWE_AGENT_RUNS):
        if path.endswith(".traj.json"):
            messages = repository.json(path)["messages"]
            steps = mini_swe_agent_steps(messages)
            if steps:
                runs.append((len(steps), path, messages, steps))
    runs.sort(key=lambda run: (run[0], run[1]))
    last = len(runs) - 1
    picked = [runs[round(i * last / (MINI_SWE_AGENT_PICKS - 1))] for i in range(MINI_SWE_AGENT_PICKS)]
    out = []
    for count, path, messages, steps in picked:
        name = "mini-" + Path(path).name.removesuffix(".traj.json")
        out.append((name, path, body(name, messages[0]["content"], messages[1]["content"], steps), count))
    return out


def swe_agent(repository: Repository) -> list[tuple[str, str, dict[str, Any], int]]:
    out = []
    for name, file in SWE_AGENT_PICKS.items():
        path = SWE_AGENT_DEMOS + file
        history = repository.json(path)["history"]
        steps: list[Step] = []
        for entry, answer in replies(history, ("user", "tool")):
            if answer is None:
                break
            steps.append((entry["thought"].strip(), entry["action"].strip(), answer["content"]))
        out.append((name, path, body(name, history[0]["content"], history[1]["content"], steps), len(steps)))
    return out


def busiest_turn(messages: list[dict[str, Any]]) -> tuple[int, int]:
    """(steps, end) of the user turn with the most tool-calling replies (the later one of a tie):
    `end` is just past the turn's last tool result, where the agent sent its next request."""
    users = [i for i, message in enumerate(messages) if is_user_input(message)]
    best = (0, 0)
    for start, stop in zip(users, [*users[1:], len(messages)], strict=True):
        turn = messages[start:stop]
        results = [i for i, message in enumerate(turn) if message["role"] == "tool"]
        if not results:
            continue
        calls = [message for message in turn[: results[-1]] if message["role"] == "assistant"]
        steps = sum(1 for message in calls if message.get("tool_calls"))
        if steps >= best[0]:
            best = (steps, start + results[-1] + 1)
    return best


def tau_bench(repository: Repository) -> list[tuple[str, str, dict[str, Any], int]]:
    runs = []
    for index, run in enumerate(repository.json(TAU_BENCH_RUNS)):
        steps, end = busiest_turn(run["traj"])
        if steps >= TAU_BENCH_MIN_STEPS:
            runs.append((steps, index, run["traj"][:end]))
    runs.sort(key=lambda run: (run[0], run[1]))
    last = len(runs) - 1
    picked = [runs[round(i * last / (TAU_BENCH_PICKS - 1))] for i in range(TAU_BENCH_PICKS)]
    path = f"{TAU_BENCH_RUNS}[{{}}]"
    return [
        (f"tau-airline-{index:03d}", path.format(index), {"model": MODEL, "messages": messages}, steps)
        for steps, index, messages in picked
    ]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mini-swe-agent", type=Path, required=True, help=f"git dir of {MINI_SWE_AGENT[0]}")
    parser.add_argument("--swe-agent", type=Path, required=True, help=f"git dir of {SWE_AGENT[0]}")
    parser.add_argument("--tau-bench", type=Path, help=f"git dir of {TAU_BENCH[0]} (optional)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sources = [
        (MINI_SWE_AGENT, mini_swe_agent(Repository(args.mini_swe_agent, MINI_SWE_AGENT[1]))),
        (SWE_AGENT, swe_agent(Repository(args.swe_agent, SWE_AGENT[1]))),
    ]
    if args.tau_bench:
        sources.append((TAU_BENCH, tau_bench(Repository(args.tau_bench, TAU_BENCH[1]))))
    args.out.mkdir(parents=True, exist_ok=True)
    counter = counter_for(MODEL)
    lines = ["file\tsource\tpath\tsteps\ttokens"]
    for (repo, commit), transcripts in sources:
        for name, path, data, steps in transcripts:
            (args.out / f"{name}.json").write_bytes(orjson.dumps(data))
            tokens = counter.messages(data["messages"])
            lines.append(f"{name}.json\t{repo}@{commit[:8]}\t{path}\t{steps}\t{tokens}")
    (args.out / "manifest.tsv").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
