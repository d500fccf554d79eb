"""The conversation memories' shared store (gateway/openings.py): newest first per opening, the
one an entry grew from replaced, bounded by count per opening and by bytes overall."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.openings import Openings


@dataclass(frozen=True, eq=False)
class Entry:
    size: int


def test_newest_first_with_the_grown_from_entry_replaced() -> None:
    store: Openings[Entry] = Openings(per_opening=3, max_bytes=1_000)
    first, second = Entry(10), Entry(20)
    store.remember("a", first, None)
    store.remember("a", second, None)
    grown = Entry(30)
    store.remember("a", grown, replaces=second)
    assert store.newest_first("a") == [grown, first]
    assert store.newest_first("b") == []
    assert store.size == 40


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 400), st.booleans()), min_size=1, max_size=60)
)
def test_the_bounds_hold_and_the_size_is_what_is_held(steps: list[tuple[int, int, bool]]) -> None:
    store: Openings[Entry] = Openings(per_opening=3, max_bytes=1_000)
    for opening, size, grows in steps:
        newest = store.newest_first(opening)
        entry = Entry(size)
        replaced = newest[0] if grows and newest else None
        store.remember(opening, entry, replaced)
        assert store.size == sum(held.size for held in store) <= 1_000
        assert all(len(store.newest_first(key)) <= 3 for key in range(6))
        beside = [old for old in newest if old is not replaced][:2]
        if size + sum(old.size for old in beside) <= 1_000:  # else its opening alone is over the bound
            assert store.newest_first(opening)[0] is entry  # other openings leave first
