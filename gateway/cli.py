"""The ``context-gateway`` command: serve, compress, count."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from gateway.settings import ConfigError, load_settings


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="context-gateway", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="YAML config file (default: $GATEWAY_CONFIG, else built-in defaults)")
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default 8080)")

    compress = commands.add_parser("compress", help="dry-run the compression of a request body")
    compress.add_argument("--model", required=True)
    size = compress.add_mutually_exclusive_group(required=True)
    size.add_argument("--window", type=int, help="context window; the budget is derived as the gateway does")
    size.add_argument("--budget", type=int, help="prompt token budget to fit into")
    compress.add_argument("--aggressive", action="store_true", help="leave extra headroom")
    compress.add_argument(
        "file", help="chat-completions request body or bare message list (JSON); - for stdin"
    )

    count = commands.add_parser("count", help="count a request's prompt tokens and show its budget")
    count.add_argument("--model", required=True)
    count.add_argument("--config", help="YAML config file (for model window overrides)")
    count.add_argument("--verbose", action="store_true", help="per-message counts")
    count.add_argument("file", help="chat-completions request body or bare message list (JSON); - for stdin")

    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "compress":
            return _compress(args)
        return _count(args)
    except ConfigError as exc:
        print(f"context-gateway: configuration error: {exc}", file=sys.stderr)
        return 2
    except InputError as exc:
        print(f"context-gateway: {exc}", file=sys.stderr)
        return 2


class InputError(Exception):
    pass


def _serve(args: argparse.Namespace) -> int:
    from gateway.server.run import serve

    settings = load_settings(args.config)
    serve(settings, host=args.host or settings.server.host, port=args.port or settings.server.port)
    return 0


def _read_request(path: str) -> dict[str, Any]:
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
        data = orjson.loads(raw)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON: {exc}") from None
    if isinstance(data, list):
        return {"messages": data}
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise InputError(f"{path} must hold a chat-completions body or a list of messages")
    return data


def _compress(args: argparse.Namespace) -> int:
    from gateway.compress import ContextBudgetExceeded, fit
    from gateway.settings import BudgetSettings
    from gateway.tokens.counter import counter_for

    body = _read_request(args.file)
    counter = counter_for(args.model)
    tokens = counter.request(body)
    fixed = tokens - counter.messages(body["messages"])
    budget = args.budget if args.window is None else BudgetSettings().usable(args.window, body)
    try:
        result = fit(
            body["messages"], model=args.model, budget_tokens=budget - fixed, aggressive=args.aggressive
        )
    except ContextBudgetExceeded as exc:
        print(f"context-gateway: cannot fit: {exc}", file=sys.stderr)
        return 1
    out = {**body, "messages": result.messages}
    sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")
    print(
        f"model {args.model}: budget {budget} tokens; "
        f"prompt {tokens} -> {result.tokens_after + fixed} tokens; "
        f"stages: {', '.join(result.stages) or 'none'}; messages dropped: {result.messages_dropped}",
        file=sys.stderr,
    )
    return 0


def _count(args: argparse.Namespace) -> int:
    from gateway.tokens.counter import counter_for
    from gateway.tokens.windows import WindowResolver

    settings = load_settings(args.config)
    body = _read_request(args.file)
    counter = counter_for(args.model)
    if args.verbose:
        for index, message in enumerate(body["messages"]):
            role = message.get("role") if isinstance(message, dict) else "?"
            print(f"  [{index}] {role}: {counter.message(message)} tokens")
    tokens = counter.request(body)
    window = WindowResolver(overrides=settings.window_overrides()).resolve_window(args.model)
    method = "exact (tiktoken " + counter.profile.encoding_name + ")" if counter.exact else "estimated"
    print(f"prompt tokens: {tokens} ({method})")
    if window.tokens is None:
        print("context window: unknown (the gateway forwards as is and learns it from an overflow error)")
        return 0
    budget = settings.budget.usable(window.tokens, body)
    print(f"context window: {window.tokens} (from {window.source})")
    print(f"usable budget: {budget} -> {'fits' if tokens <= budget else 'over budget: would be compressed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
