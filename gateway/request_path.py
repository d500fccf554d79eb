"""Request paths: refused when unsafe, sent upstream as the client encoded them (another
spelling of a prompt route, with repeated or trailing slashes, is routed and sent as that route).

A path that could name another resource once some server on the way decodes or normalises
it — dot segments (``..``, ``%2e%2e``), encoded separators (``%2f``, ``%5c``), backslashes,
control characters (``%00``, CR, LF), path parameters (``;``) — answers 400 before routing
(Starlette's routes would not even match a decoded newline, and answer 404 quoting it).
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import GatewayError
from gateway.log_safety import printable

# Percent-escapes of "/" and "\": decoded by some server on the way, they change the path.
_ENCODED_SEPARATOR = re.compile(r"%(2f|5c)", re.IGNORECASE)
# The routes whose bodies the gateway reads, counts and fits (gateway/app.py).
PROMPT_PATHS = frozenset({"/v1/chat/completions", "/v1/messages", "/v1/responses"})
_REPEATED_SLASHES = re.compile(r"//+")
_LONE_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
# RFC 3986 pchar plus "/" and "%" (escapes are kept as sent): everything else is escaped.
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"


def path_problem(raw_path: bytes) -> str | None:
    """Why the path is unsafe to route or forward, or None."""
    raw = raw_path.decode("latin-1")
    decoded = unquote(raw, errors="replace")
    if not decoded.isprintable():
        return "control characters"
    if "\\" in raw or _ENCODED_SEPARATOR.search(raw):
        return "an encoded or backslash path separator"
    if any(segment in (".", "..") for segment in decoded.split("/")):
        return "a dot segment"
    if ";" in decoded:  # path parameters: servers that strip them (Tomcat, Spring) route what remains
        return "a semicolon"
    return None


def upstream_path(raw_path: bytes) -> str:
    """The client's path for the upstream request line: its escapes kept, nothing raw (a space) left."""
    return quote(_LONE_PERCENT.sub("%25", raw_path.decode("latin-1")), safe=_PATH_SAFE)


class PathGuard:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
            problem = path_problem(raw_path)
            if problem is not None:
                error = GatewayError(
                    400,
                    f"Invalid URL path {printable(raw_path.decode('latin-1'))!r}: it contains {problem}.",
                    param="path",
                    code="invalid_path",
                )
                await error.response()(scope, receive, send)
                return
            if (canonical := prompt_route_alias(scope["path"])) is not None:
                scope = {**scope, "path": canonical, "raw_path": canonical.encode()}
        await self.app(scope, receive, send)


def prompt_route_alias(path: str) -> str | None:
    """The prompt route a path is another spelling of (`/v1//chat/completions`, a trailing
    slash, `/v1/Chat/Completions`), or None. Relayed as pass-through, such a path skipped every
    token limit, cap and compression, while the upstream (nginx merges slashes by default, some
    servers ignore case) served it as the route."""
    canonical = _REPEATED_SLASHES.sub("/", path).rstrip("/").lower()  # some servers ignore case
    return canonical if canonical != path and canonical in PROMPT_PATHS else None
