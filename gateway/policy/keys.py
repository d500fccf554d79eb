"""Gateway keys: their stored form, how a new one is made, and how a caller's key finds its team.

Only SHA-256 digests are configured, so the config file holds nothing a caller could use. A
presented key is hashed and its digest compared with every configured digest by
`hmac.compare_digest`, without stopping at a match: the time taken is the same whichever key
matches, and however many characters of a real key a guess shares (~0.1 µs per configured key).
Gateway keys are random 256-bit strings, so a fast unsalted hash is enough (no dictionary to
attack).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping

from starlette.datastructures import Headers

from gateway.policy.config import TeamSettings

KEY_PREFIX = "cgw-"
KEY_HEADERS = ("authorization", "api-key", "x-api-key")
# Longest Authorization value considered; longer ones are refused without hashing.
MAX_PRESENTED_KEY = 512


def hash_key(key: str) -> str:
    """The configured form of a gateway key: ``sha256:<64 hex>``."""
    return "sha256:" + hashlib.sha256(key.encode("utf-8", errors="surrogatepass")).hexdigest()


def configured_key(text: str) -> str:
    """``text`` as a request would present it (stripped as `presented_key` strips a token);
    ValueError, naming the limit, when no request could ever present it."""
    key = text.strip()
    if not key:
        raise ValueError("the key is empty")
    if len(key) > MAX_PRESENTED_KEY:
        raise ValueError(
            f"the key has {len(key)} characters; the gateway refuses keys over {MAX_PRESENTED_KEY}"
        )
    # Header values reach the gateway as bytes read as Latin-1, and clients encode a key as ASCII
    # (some as UTF-8): beyond printable ASCII, the hashed text is not the text that arrives.
    if not all(" " <= char <= "~" for char in key):
        raise ValueError("the key must be printable ASCII, as an HTTP header carries it")
    return key


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def presented_key(headers: Headers) -> str | None:
    """The bearer token of ``Authorization`` (OpenAI's SDKs), else ``api-key`` (Azure's), else
    ``x-api-key`` (Anthropic's)."""
    value = headers.get("authorization")
    if value is not None:
        scheme, _, token = value.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
    else:
        token = (headers.get("api-key") or headers.get("x-api-key") or "").strip()
    if not token or len(token) > MAX_PRESENTED_KEY:
        return None
    return token


class KeyIndex:
    """Every configured key digest with its team's name."""

    def __init__(self, teams: Mapping[str, TeamSettings]) -> None:
        self._keys = [(bytes.fromhex(key[7:]), name) for name, team in teams.items() for key in team.keys]

    def team_for(self, key: str) -> str | None:
        digest = hashlib.sha256(key.encode("utf-8", errors="surrogatepass")).digest()
        found = None
        for stored, name in self._keys:
            if hmac.compare_digest(stored, digest):
                found = name
        return found
