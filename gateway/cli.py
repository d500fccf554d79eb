"""The context-gateway command: serve, compress, count, keys, usage, windows."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from gateway import __version__
from gateway.log_safety import printable
from gateway.settings import (
    CONFIG_ENV,
    ENV_PREFIX,
    ConfigError,
    Settings,
    is_loopback,
    load_settings,
    redact_url,
    summarizer_url_problem,
)

if TYPE_CHECKING:
    from gateway.compress.fit import DroppedSpan, FitResult

log = logging.getLogger("gateway")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="context-gateway", description=__doc__)
    parser.add_argument("--version", action="version", version=f"context-gateway {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="YAML config file (default: $GATEWAY_CONFIG, else built-in defaults)")
    serve.add_argument("--host", help="listen address (default: server.host, 127.0.0.1)")
    serve.add_argument("--port", type=_port, help="listen port (default: server.port, 8080)")
    serve.add_argument(
        "--workers",
        help="worker processes: a number, or auto (one per usable CPU); default server.workers, 1",
    )

    compress = commands.add_parser("compress", help="dry-run the compression of a request body")
    compress.add_argument("--model", required=True, help="the model the body is for (its tokenizer)")
    size = compress.add_mutually_exclusive_group(required=True)
    size.add_argument(
        "--window",
        type=int,
        help="context window; the budget is derived as the gateway does (default budget settings)",
    )
    size.add_argument("--budget", type=int, help="prompt token budget to fit into")
    compress.add_argument("--aggressive", action="store_true", help="leave extra headroom")
    compress.add_argument(
        "--markers",
        choices=("separate", "merged"),
        default="separate",
        help="merged: user messages in a row, where messages were dropped, joined (compression.markers)",
    )
    compress.add_argument(
        "--summarizer-url", help="summarize dropped turns with this chat-completions base URL (…/v1)"
    )
    compress.add_argument(
        "--summarizer-model", default="gpt-4o-mini", help="the summarizer's model (default gpt-4o-mini)"
    )
    compress.add_argument(
        "file", help="chat-completions request body or bare message list (JSON); - for stdin"
    )

    count = commands.add_parser("count", help="count a request's prompt tokens and show its budget")
    count.add_argument("--model", required=True, help="the model the body is for (its tokenizer and window)")
    count.add_argument(
        "--config", help="YAML config file (default: $GATEWAY_CONFIG; for models and budget settings)"
    )
    count.add_argument("--verbose", action="store_true", help="per-message counts")
    count.add_argument("file", help="chat-completions request body or bare message list (JSON); - for stdin")

    keys = commands.add_parser("keys", help="make or hash gateway keys for the teams section")
    key_commands = keys.add_subparsers(dest="keys_command", required=True)
    key_hash = key_commands.add_parser(
        "hash", help="print the sha256: form of a key to put in teams.<name>.keys"
    )
    key_hash.add_argument("key", help="the key (- to read it from stdin, keeping it out of shell history)")
    key_commands.add_parser("new", help="make a random key; print it and its sha256: form")

    usage = commands.add_parser("usage", help="print recorded team usage (from Redis)")
    usage.add_argument("--config", help="YAML config file (its redis_url and teams)")
    usage.add_argument("--team", help="one team (default: every configured team)")
    usage.add_argument("--day", help="UTC day as YYYY-MM-DD (default: today)")
    windows = commands.add_parser("windows", help="show or clear learned and discovered context windows")
    actions = windows.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="learned and discovered windows in the store (Redis)")
    listing.add_argument("--config", help="YAML config file (for redis_url)")
    listing.add_argument(
        "--limit", type=int, default=1000, help="at most this many of each kind (default 1000)"
    )
    forget = actions.add_parser("forget", help="clear what the store holds for a model, on every replica")
    forget.add_argument("--config", help="YAML config file (for redis_url)")
    forget.add_argument("model", help="the model name as clients send it")
    resolve = actions.add_parser(
        "resolve", help="the window each name resolves to without the store, and why"
    )
    resolve.add_argument("--config", help="YAML config file (for model window overrides)")
    resolve.add_argument("model", nargs="+", help="model names as clients send them")

    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "compress":
            return _compress(args)
        if args.command == "keys":
            return _keys(args)
        if args.command == "usage":
            return _usage(args)
        if args.command == "windows":
            return _windows(args)
        return _count(args)
    except ConfigError as exc:
        print(f"context-gateway: configuration error: {exc}", file=sys.stderr)
        return 2
    except InputError as exc:
        print(f"context-gateway: {exc}", file=sys.stderr)
        return 2


class InputError(Exception):
    pass


def _port(text: str) -> int:
    """A listen port: 1–65535, or argparse's own usage error (never a silently wrapped number)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text[:40]!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be between 1 and 65535, got {port}")
    return port


def _serve(args: argparse.Namespace) -> int:
    from gateway.request_log import configure_logging
    from gateway.server.cpus import worker_count
    from gateway.server.run import serve

    settings = load_settings(
        args.config, server_overrides={"host": args.host, "port": args.port, "workers": args.workers}
    )
    configure_logging(settings.server.log_format, settings.server.log_level)
    workers = worker_count(settings.server.workers)
    log.info("%s; %d worker process%s", startup_line(settings, args.config), workers, "es" * (workers > 1))
    if (warning := unshared_limits_warning(settings, workers)) is not None:
        log.warning("%s", warning)
    serve(settings, args.config)
    return 0


def startup_line(
    settings: Settings, config_path: str | None, environ: Mapping[str, str] | None = None
) -> str:
    """What an operator needs to know this process is the one they meant to start."""
    env = os.environ if environ is None else environ
    source = config_path or env.get(CONFIG_ENV) or "built-in defaults"
    overrides = sum(1 for name in env if name.upper().startswith(ENV_PREFIX) and name != CONFIG_ENV)
    if overrides:
        source += f" and {overrides} {ENV_PREFIX}* variable{'s' if overrides > 1 else ''}"
    store = redact_url(settings.redis_url) if settings.redis_url else "memory (this process only)"
    host = settings.server.host
    address = f"[{host}]" if ":" in host else host
    exposure = "" if is_loopback(host) else " (reachable from the network)"
    return (
        f"context-gateway {__version__}: config {source}; upstream {redact_url(settings.upstream.base_url)} "
        f"with {_upstream_keys(settings)}; store {store}; listening on http://{address}:{settings.server.port}"
        f"{exposure}"
    )


def _upstream_keys(settings: Settings) -> str:
    """Which key the upstream sees: with teams, a caller's own key never crosses."""
    own = "the gateway's own key" if settings.upstream.api_key else None
    if not settings.teams:
        return own or "each caller's own key"
    keyed = sum(1 for team in settings.teams.values() if team.upstream_api_key)
    if keyed:
        return f"their own key for {keyed} of {len(settings.teams)} teams, else {own or 'no key'}"
    return own or "no key (teams are set: callers' keys do not cross)"


def unshared_limits_warning(settings: Settings, workers: int) -> str | None:
    """Team limits held per process: without Redis each worker keeps its own budgets, so a team
    gets its limits once per worker (measured: 6 requests a minute admitted for a limit of 3
    with two workers), which nothing else would tell the operator."""
    if workers <= 1 or settings.redis_url:
        return None
    limited = sorted(
        name
        for name, team in settings.teams.items()
        if team.limits.requests_per_minute or team.limits.tokens_per_minute or team.limits.tokens_per_day
    )
    if not limited:
        return None
    named = ", ".join(limited[:3]) + (f" and {len(limited) - 3} more" if len(limited) > 3 else "")
    return (
        f"team limits ({named}) are kept in memory by each of the {workers} worker processes: "
        f"a team may use up to {workers}x its limits here, and as much again on every other replica; "
        "set redis_url to share them"
    )


def _read_request(path: str, model: str) -> dict[str, Any]:
    """The body in the file, held to what the gateway's route accepts (with `model` as its model)."""
    from gateway.errors import GatewayError
    from gateway.wire.chat import validate_chat_body

    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
        data = orjson.loads(raw)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON: {exc}") from None
    if isinstance(data, list):
        data = {"messages": data}
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise InputError(f"{path} must hold a chat-completions body or a list of messages")
    try:
        validate_chat_body({**data, "model": model})
    except GatewayError as exc:
        raise InputError(f"{path}: {exc.message}") from None
    return data


def _compress(args: argparse.Namespace) -> int:
    from gateway.compress import ContextBudgetExceeded, fit
    from gateway.compress.markers import join_user_runs
    from gateway.settings import BudgetSettings
    from gateway.tokens.counter import counter_for

    if args.summarizer_url and (problem := summarizer_url_problem(args.summarizer_url)):
        raise InputError(f"--summarizer-url {problem}")
    body = _read_request(args.file, args.model)
    counter = counter_for(args.model)
    tokens = counter.request(body)
    fixed = tokens - counter.messages(body["messages"])
    budget = args.budget if args.window is None else BudgetSettings().usable(args.window, body)

    def fitted(summaries: dict[str, str]) -> FitResult:
        return fit(
            body["messages"],
            model=args.model,
            budget_tokens=budget - fixed,
            aggressive=args.aggressive,
            summaries=summaries,
        )

    summarizer_failures = ""
    try:
        result = fitted({})
        if args.summarizer_url and result.spans:
            summaries, reasons = asyncio.run(_summaries(args, result.spans))
            if len(summaries) < len(result.spans):
                summarizer_failures = (
                    f"summarizer at {redact_url(args.summarizer_url)} gave no summary for "
                    f"{len(result.spans) - len(summaries)} of {len(result.spans)} dropped span(s) "
                    f"({', '.join(sorted(reasons)) or 'no reason recorded'}): the digest stands in"
                )
            result = fitted(summaries)
    except ContextBudgetExceeded as exc:
        print(f"context-gateway: cannot fit: {exc}", file=sys.stderr)
        return 1
    merged = args.markers == "merged" and result.spans
    messages = join_user_runs(result.messages) if merged else result.messages
    out = {**body, "messages": messages}
    sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")
    print(
        f"model {args.model}: budget {budget} tokens; "
        f"prompt {tokens} -> {counter.request(out) if merged else result.tokens_after + fixed} tokens; "
        f"stages: {', '.join(result.stages) or 'none'}; messages dropped: {result.messages_dropped}",
        file=sys.stderr,
    )
    for span in result.spans:  # the account each marker carries is in the output above
        print(
            f"dropped span {span.key[:12]}: {len(span.messages)} messages, "
            f"{span.account or 'no account'} within {span.room} tokens",
            file=sys.stderr,
        )
    if summarizer_failures:
        print(f"context-gateway: {summarizer_failures}", file=sys.stderr)
    return 0


async def _summaries(
    args: argparse.Namespace, spans: Sequence[DroppedSpan]
) -> tuple[dict[str, str], set[str]]:
    """Summaries of the dropped spans from the summarizer at --summarizer-url (inline, nothing
    cached), and the reasons of its failures (timeout, unreachable, status_4xx …)."""
    from gateway.settings import SummarizerSettings, UpstreamSettings
    from gateway.store import MemoryStore
    from gateway.summarize import Summarizer

    settings = SummarizerSettings(model=args.summarizer_model, base_url=args.summarizer_url, mode="inline")
    summarizer = Summarizer(settings, UpstreamSettings(), MemoryStore())
    failed_before = _summary_failures()
    try:
        summaries = await summarizer.wait_for(spans, args.model)
    finally:
        await summarizer.close()
    failed = _summary_failures()
    return summaries, {reason for reason, count in failed.items() if count > failed_before.get(reason, 0)}


def _summary_failures() -> dict[str, float]:
    """Summarizer failures so far by reason: the summarizer records them only in its metric."""
    from gateway.metrics import SUMMARY_FAILURES

    return {
        sample.labels["reason"]: sample.value
        for family in SUMMARY_FAILURES.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def _count(args: argparse.Namespace) -> int:
    from gateway.tokens.counter import counter_for
    from gateway.tokens.windows import WindowResolver

    settings = load_settings(args.config)
    body = _read_request(args.file, args.model)
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


def _keys(args: argparse.Namespace) -> int:
    from gateway.policy.keys import configured_key, hash_key, new_key

    if args.keys_command == "new":
        key = new_key()
        print(f"key:  {key}")
        print(f"hash: {hash_key(key)}")
        return 0
    try:
        key = configured_key(sys.stdin.readline() if args.key == "-" else args.key)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    print(hash_key(key))
    return 0


def _usage(args: argparse.Namespace) -> int:
    import asyncio
    import time

    from gateway.policy.config import TEAM_NAME
    from gateway.policy.limits import DAY_SECONDS, RedisLimits, day_name, day_number
    from gateway.store.redis import READ_ANY_BYTES, STORE_ERRORS

    settings = load_settings(args.config)
    if not settings.redis_url:
        raise InputError("usage is recorded in Redis: set redis_url (without it each process counts alone)")
    try:
        day = int(time.time() // DAY_SECONDS) if args.day is None else day_number(args.day)
    except ValueError:
        raise InputError(f"--day must be a date as YYYY-MM-DD, got {args.day[:40]!r}") from None
    if args.team is not None and not TEAM_NAME.fullmatch(args.team):
        raise InputError(f"--team must be a team name (letters, digits, _ . -), got {args.team[:40]!r}")
    teams = [args.team] if args.team else sorted(settings.teams)
    if not teams:
        raise InputError("no teams: configure teams, or name one with --team")

    async def read() -> list[tuple[str, str, Any]]:
        store = RedisLimits(settings.redis_url or "", timeout=5.0, **READ_ANY_BYTES)
        try:
            return [
                (team, model, usage)
                for team in teams
                for model, usage in (await store.usage(team, day)).items()
            ]
        finally:
            await store.close()

    try:
        rows = asyncio.run(read())
    except STORE_ERRORS as exc:
        raise _store_failure("usage", settings, exc) from None
    print(f"usage on {day_name(day)} (UTC)")
    print(f"{'team':<20} {'model':<32} {'requests':>9} {'prompt':>12} {'completion':>12} {'saved':>12}")
    for team, model, usage in rows:
        print(  # model names come from clients: never let one write control sequences to a terminal
            f"{team:<20} {printable(model):<32} {usage.requests:>9} {usage.prompt:>12} "
            f"{usage.completion:>12} {usage.saved:>12}"
        )
    if not rows:
        print("(nothing recorded)")
    return 0


def _windows(args: argparse.Namespace) -> int:
    import asyncio

    from gateway.tokens.windows import WindowResolver

    settings = load_settings(args.config)
    if args.action == "resolve":
        resolver = WindowResolver(overrides=settings.window_overrides())
        for model in args.model:
            found = resolver.resolve_window(model)
            detail = f" ({found.detail})" if found.detail else ""
            print(f"{model}\t{found.tokens or '-'}\t{found.source}{detail}")
        return 0
    if not settings.redis_url:
        print(
            "context-gateway: no redis_url configured: each gateway process keeps its learned windows "
            "in its own memory, out of reach of this command (they expire after "
            f"windows.learned_ttl_seconds = {settings.windows.learned_ttl_seconds} s)",
            file=sys.stderr,
        )
        return 2
    from gateway.store.redis import STORE_ERRORS

    try:
        return asyncio.run(_windows_in_store(args, settings.redis_url))
    except STORE_ERRORS as exc:
        raise _store_failure(f"windows {args.action}", settings, exc) from None


async def _windows_in_store(args: argparse.Namespace, redis_url: str) -> int:
    import time

    from gateway.store.redis import READ_ANY_BYTES, RedisStore
    from gateway.tokens.window_records import forget, list_records

    # An operator's command: no hurry, and no breaker to skip a slow Redis.
    store = RedisStore(redis_url, timeout=5.0, cooldown=0.0, **READ_ANY_BYTES)
    try:
        if args.action == "forget":
            deleted = await forget(store, args.model)
            model = printable(args.model)
            print(f"{model}: {deleted} record(s) removed" if deleted else f"{model}: nothing stored")
            return 0
        listing = await list_records(store, max(1, args.limit))
        print("model\twindow\tsource\texpires in\tdetail")
        now = time.time()
        for record in listing.records:
            expires = f"{max(0, round(record.expires_at - now))} s"
            # Names and servers come from clients and upstreams: one record, one line, no escapes.
            print(
                f"{printable(record.model)}\t{record.window or '-'}\t{record.source}\t{expires}\t"
                f"{printable(record.detail)}"
            )
        if listing.unreadable:
            print(
                f"context-gateway: {listing.unreadable} key(s) under the gateway's prefixes hold no "
                "window record it wrote; skipped",
                file=sys.stderr,
            )
        return 0
    finally:
        await store.close()


def _store_failure(command: str, settings: Settings, exc: BaseException) -> InputError:
    """Redis unreachable, or refusing (no such database, wrong password): said in one line."""
    url = redact_url(settings.redis_url or "")
    return InputError(f"{command}: Redis at {url} failed: {type(exc).__name__}: {printable(str(exc))}")


if __name__ == "__main__":
    sys.exit(main())
