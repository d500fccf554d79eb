"""What the store holds about context windows, for `context-gateway windows list | forget`.

Reads and deletes the records the gateway writes (`learned_windows.learned_key`,
`discovery.store_key`); never used on the request path.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

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


async def list_records(store: Store, limit: int) -> list[WindowRecord]:
    """Learned and discovered windows in the store, by model name (up to ``limit`` of each kind)."""
    records: list[WindowRecord] = []
    for prefix, parse in ((LEARNED_PREFIX, _learned), (discovery.DISCOVERED_PREFIX, _discovered)):
        for key in await store.keys(prefix, limit):
            raw = await store.get(key)
            record = None if raw is None else parse(key[len(prefix) :], raw)
            if record is not None:
                records.append(record)
    return sorted(records, key=lambda record: (record.model, record.source))


async def forget(store: Store, model: str) -> int:
    """Delete what the store holds for ``model``; how many records there were."""
    deleted = [await store.delete(key) for key in (learned_key(model), discovery.store_key(model))]
    return sum(deleted)
