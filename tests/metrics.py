"""Reading a served gateway's /metrics as an operator's scrape sees it."""

from __future__ import annotations

import httpx


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples carrying `labels` (0.0 when there are none); `url` is the
    gateway's origin or its `/v1` base URL."""
    text = httpx.get(url.removesuffix("/v1") + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and line.split(" ")[0] != name:
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
