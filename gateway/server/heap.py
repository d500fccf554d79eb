"""The cyclic garbage collector's settings for a serving process.

A request's objects are freed by reference counting as it ends (no reference loops:
tests/integration/test_request_memory.py), so the collector finds nothing in them, yet at
CPython's default it still ran all the time. A young collection starts once 700 more
container objects were made than freed since the last one; the count never goes below
zero, so objects freed after a collection are not credited and it drifts up under any
steady load. Measured in the served gateway (gc.callbacks, 8 requests in flight, ~100 KB
chat bodies): a young collection every ~9 requests, each walking the ~1,200 objects of
the requests in flight; every ~1,500 requests a full one walking all that start-up
loaded (modules, the model map), 24 ms with every request in flight stalled behind it;
~27 µs of CPU per request in all, about a tenth of a small request (bench/proxy_wrk.py).

So, once started: what start-up loaded is moved out of the collector's view (`gc.freeze`;
nothing of it is garbage, and it is only freed at exit), and a young collection waits for
`YOUNG_THRESHOLD` net allocations: 2-4 young collections and no full one in the same
13,000 requests. Reference loops that do form (an exception kept with its traceback) are
still collected, a little later.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 5000


def settle_heap() -> None:
    """Freeze what start-up made and space young collections out; call once, after start-up."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
