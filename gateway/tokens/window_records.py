"""What the store holds about context windows, for `context-gateway windows list | forget`.

Reads and deletes the records the gateway writes (`learned_windows.learned_key`,
`discovery.store_key`); never used on the request path.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from redis.exceptions import ResponseError

from gateway.store.base import Store
from gateway.tokens import discovery
from gateway.tokens.learned_windows import LEARNED_PREFIX, Evidence, learned_key


@dataclass(frozen=True, slots=True)
class WindowRecord:
    model: str
    # learned (stated by an overflow error), bisected (bounds only), discovered.
    source: str
    window: int | None
    detail: str
    expires_at: float


def _learned(model: str, raw: str) -> WindowRecord | None:
    evidence = Evidence.from_json(raw)
    if evidence is None:
        return None
    if evidence.stated is not None:
        return WindowRecord(
            model, "learned", evidence.stated, "stated by an overflow error", evidence.expires_at
        )
    bounds = f"accepted {evidence.accepted or 0}, refused {evidence.refused or '-'}"
    state = "converged" if evidence.converged() else "probing"
    return WindowRecord(model, "bisected", evidence.estimate(), f"{state}: {bounds}", evidence.expires_at)


def _discovered(model: str, raw: str) -> WindowRecord | None:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    expires_at = data.get("expires_at") if isinstance(data, dict) else None
    expires_at = float(expires_at) if isinstance(expires_at, int | float) else 0.0
    found = discovery.decode(raw)
    if found is None:
        return WindowRecord(model, "discovered", None, "the upstream states no window", expires_at)
    return WindowRecord(model, "discovered", found.window, f"stated by {found.server}", expires_at)


@dataclass(frozen=True, slots=True)
class WindowListing:
    records: list[WindowRecord]
    # Keys under the gateway's prefixes holding no window record: not one it wrote (another type,
    # not JSON, not UTF-8), or one Redis refuses to read (WRONGTYPE, an ACL).
    unreadable: int


async def list_records(store: Store, limit: int) -> WindowListing:
    """Learned and discovered windows in the store, by model name (up to ``limit`` of each kind)."""
    records: list[WindowRecord] = []
    unreadable = 0
    for prefix, parse in ((LEARNED_PREFIX, _learned), (discovery.DISCOVERED_PREFIX, _discovered)):
        for key in await store.keys(prefix, limit):
            try:
                raw = await store.get(key)
            except ResponseError:  # this key only: an unreachable store raises ConnectionError
                unreadable += 1
                continue
            if raw is None:  # expired since it was listed
                continue
            record = parse(key[len(prefix) :], raw)
            if record is None:
                unreadable += 1
            else:
                records.append(record)
    return WindowListing(sorted(records, key=lambda record: (record.model, record.source)), unreadable)


async def forget(store: Store, model: str) -> int:
    """Delete what the store holds for ``model``; how many records there were."""
    deleted = [await store.delete(key) for key in (learned_key(model), discovery.store_key(model))]
    return sum(deleted)
