"""Which headers cross the gateway, each way."""

from __future__ import annotations

import os
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import Headers
from starlette.types import Scope

from gateway.proxy.upstream import forward_headers

REQUEST_ID = "x-request-id"
GATEWAY_REQUEST_ID = "x-gateway-request-id"
# The gateway's HTTP server sets its own; relaying the upstream's would send them twice.
SERVER_SET = frozenset({"date", "server"})
# Every way a client can carry a credential (OpenAI, Azure, Anthropic, Google, Azure APIM, cookies).
# When the gateway supplies the upstream key, none of them may cross: the caller's key would reach
# the upstream beside the organisation's, or replace it.
CREDENTIAL_HEADERS = frozenset(
    {"authorization", "api-key", "x-api-key", "x-goog-api-key", "ocp-apim-subscription-key", "cookie"}
)
CREDENTIAL_QUERY_PARAMS = frozenset({"api-key", "api_key", "apikey", "key", "access_token", "token"})
# What never goes upstream besides hop-by-hop headers, by (credentials replaced, identity encoding).
_DROPPED_TO_UPSTREAM = {
    (credentials, identity): frozenset(
        {
            REQUEST_ID,
            *(CREDENTIAL_HEADERS if credentials else ()),
            *(("accept-encoding",) if identity else ()),
        }
    )
    for credentials in (False, True)
    for identity in (False, True)
}


def request_id_for(headers: Headers) -> str:
    """The caller's x-request-id when it sent a sane one, else a fresh one."""
    given = headers.get(REQUEST_ID, "")
    if 0 < len(given) <= 200 and given.isprintable():
        return given
    return new_request_id()


def new_request_id() -> str:
    return os.urandom(16).hex()  # what uuid4().hex holds, less its version bits, at a quarter of the cost


def to_upstream(
    headers: Headers,
    *,
    api_key: str | None,
    request_id: str,
    identity_encoding: bool = False,
    key_header: str = "authorization",
    strip_credentials: bool = False,
) -> list[tuple[str, str]]:
    """The client's headers minus hop-by-hop ones; the configured key replaces every client credential.

    ``strip_credentials`` drops them even with no key to send: the caller's credential was the
    gateway's own key (teams), which must never reach the upstream.

    ``identity_encoding`` asks the upstream for an uncompressed answer, for the routes whose
    answer the gateway reads (usage, overflow errors). ``key_header`` is where the key goes:
    ``authorization`` (as a Bearer token, OpenAI) or ``x-api-key`` (as is, Anthropic).
    """
    drop = _DROPPED_TO_UPSTREAM[bool(api_key or strip_credentials), identity_encoding]
    out = forward_headers(headers.items(), drop)
    if api_key:
        out.append((key_header, f"Bearer {api_key}" if key_header == "authorization" else api_key))
    out.append((REQUEST_ID, request_id))
    return out


def client_query(scope: Scope) -> str:
    """The request's query string as sent (the HTTP parser admits ASCII only there). Read from the
    scope: `Request.url` would build a whole URL object on every request for it."""
    query: bytes = scope.get("query_string", b"")
    return query.decode("latin-1")


def upstream_query(query: str, *, api_key: str | None, strip_credentials: bool = False) -> str:
    """The client's query string, less any key parameter when the gateway supplies the key."""
    if not (api_key or strip_credentials) or not query:
        return query
    pairs = parse_qsl(query, keep_blank_values=True)
    kept = [(name, value) for name, value in pairs if name.lower() not in CREDENTIAL_QUERY_PARAMS]
    return query if len(kept) == len(pairs) else urlencode(kept)


def to_client(
    upstream_headers: Iterable[tuple[str, str]], *, request_id: str, extra: Iterable[tuple[str, str]] = ()
) -> list[tuple[bytes, bytes]]:
    """The upstream's headers (its x-request-id, rate limits …) plus the gateway's own."""
    out: list[tuple[bytes, bytes]] = []
    has_request_id = False
    for name, value in upstream_headers:
        lower = name.lower()
        if lower in SERVER_SET:
            continue
        has_request_id = has_request_id or lower == REQUEST_ID
        out.append((lower.encode("latin-1"), value.encode("latin-1")))
    if not has_request_id:
        out.append((REQUEST_ID.encode(), request_id.encode("latin-1")))
    out.append((GATEWAY_REQUEST_ID.encode(), request_id.encode("latin-1")))
    out.extend((name.encode("latin-1"), value.encode("latin-1")) for name, value in extra)
    return out
