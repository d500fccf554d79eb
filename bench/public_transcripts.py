"""The public agent transcripts of the README's loop table, rebuilt from their repositories.

    python -m bench.public_transcripts --mini-swe-agent GIT_DIR --swe-agent GIT_DIR --out DIR

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

A step becomes an assistant message (its thought as content, its command as one `bash`
tool call with an id of OpenAI's length, derived from the file and step) and a `tool`
message with the output verbatim. A last reply with no output after it is left out.
Both repositories are MIT-licensed; nothing of theirs is in this one.
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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mini-swe-agent", type=Path, required=True, help=f"git dir of {MINI_SWE_AGENT[0]}")
    parser.add_argument("--swe-agent", type=Path, required=True, help=f"git dir of {SWE_AGENT[0]}")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sources = [
        (MINI_SWE_AGENT, mini_swe_agent(Repository(args.mini_swe_agent, MINI_SWE_AGENT[1]))),
        (SWE_AGENT, swe_agent(Repository(args.swe_agent, SWE_AGENT[1]))),
    ]
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
