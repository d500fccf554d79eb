"""The digest never makes one fact of two records: what a model reads in a marker is what some record said.

A search or lookup tool returns a list of records on one line; the digest of a dropped span
used to clip that line to its head and tail, printing the first record's name with the last
record's prices. These tests read the digest as a model would, line by line, and check that
every value in a line belongs to the record the line names.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gateway  # noqa: F401
from gateway.compress import fit
from gateway.compress.digest import digest
from gateway.tokens.counter import counter_for

COUNT = counter_for("gpt-4o").text
ROOM = 4000  # room for every candidate: what is printed is decided by the lines, not the cap


def searched(result: str, name: str = "search_direct_flight") -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Find me a flight from ORD to PHL on May 26."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps({"origin": "ORD"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": result},
    ]


def flight(number: str, seats: tuple[int, int, int], prices: tuple[int, int, int]) -> dict[str, Any]:
    return {
        "flight_number": number,
        "origin": "ORD",
        "destination": "PHL",
        "scheduled_departure_time_est": "17:00:00",
        "scheduled_arrival_time_est": "19:00:00",
        "status": "available",
        "available_seats": dict(zip(("basic_economy", "economy", "business"), seats, strict=True)),
        "prices": dict(zip(("basic_economy", "economy", "business"), prices, strict=True)),
    }


FLIGHTS = [
    flight("HAT139", (7, 1, 7), (65, 114, 395)),
    flight("HAT271", (20, 3, 14), (83, 174, 338)),
    flight("HAT289", (17, 14, 10), (83, 161, 253)),
]


def fact_lines(text: str) -> list[str]:
    body = text.split("Facts and decisions:\n", 1)[1].split("\nTool calls:", 1)[0]
    return [line[2:] for line in body.splitlines()]


def test_a_flight_in_the_digest_carries_its_own_prices_not_another_flights() -> None:
    # The reported case: the search API's answer, one line of JSON as json.dumps writes it.
    text = digest(searched(json.dumps(FLIGHTS)), ROOM, COUNT)
    lines = fact_lines(text)
    for record in FLIGHTS:
        number, prices = record["flight_number"], record["prices"]
        named = [line for line in lines if number in line]
        assert named, f"{number} is missing from the digest"
        for line in named:
            assert f'"economy":{prices["economy"]}' in line.replace(" ", ""), line
            others = {f["flight_number"] for f in FLIGHTS} - {number}
            assert not any(other in line for other in others), line
    assert "161" not in " ".join(line for line in lines if "HAT139" in line)


def test_records_of_a_list_are_not_taken_for_corrections_of_each_other() -> None:
    # JSON lines: every record states "port"; the later ones do not correct the earlier.
    # A serial past 64 bits is printed as the record holds it, digit for digit.
    hosts = "\n".join(
        json.dumps({"host": f"db-{i}.internal", "port": 5430 + i, "serial": 2**70 + i}) for i in range(3)
    )
    lines = fact_lines(digest(searched(hosts, "list_hosts"), ROOM, COUNT))
    for i in range(3):
        assert any(
            f"db-{i}.internal" in line and str(5430 + i) in line and str(2**70 + i) in line for line in lines
        ), lines


def test_a_record_too_long_for_one_line_is_split_into_lines_that_each_name_it() -> None:
    reservations = [
        {
            "notes": " ".join(f"note{i}w{j}" for j in range(30 - 25 * i)),  # the first one too long
            "kind": "reservation",
            "reservation_id": f"RES{i}",  # the id, not the first short field, names its lines
            "payment_id": f"credit_card_{i}000",
            "amount": 1000 + i,
        }
        for i in range(2)
    ]
    lines = fact_lines(digest(searched(json.dumps(reservations), "get_reservations"), ROOM, COUNT))
    for i in range(2):
        amount = [line for line in lines if f'"amount":{1000 + i}' in line]
        assert amount and all(f'"reservation_id":"RES{i}"' in line for line in amount), lines
        # the fields left out of a line are marked, so it does not read as the whole record
        assert all(("…" in line) == (i == 0) for line in amount), amount
    for line in lines:
        assert len(set(re.findall(r"(?:RES|note|credit_card_|amount\":100)(\d)", line))) <= 1, line


def test_a_long_sentence_is_cut_at_its_end_not_joined_to_its_tail() -> None:
    sentence = (
        "The primary database is db-1.internal on port 5432 "
        + "while the migration runs through its many phases and checks " * 6
        + "and the replica db-9.internal is retired"
    )
    lines = fact_lines(digest([{"role": "assistant", "content": sentence}], ROOM, COUNT))
    assert len(lines) == 1 and lines[0].endswith("…")
    assert sentence.startswith(lines[0][:-1]) and "db-9" not in lines[0]
    # and never inside a number: a price cut from 1000041 to 10000 would be another price
    orders = [str(1_000_000 + i) for i in range(60)]
    (line,) = fact_lines(
        digest([{"role": "assistant", "content": "Orders: " + ",".join(orders)}], ROOM, COUNT)
    )
    assert line.endswith("…") and set(re.findall(r"\d+", line)) <= set(orders), line


def test_an_error_in_a_long_line_of_records_is_quoted_with_its_own_record_only() -> None:
    # Not JSON (a Python repr, as many tools print): still one record per digest line.
    records = [
        {"flight": f"HAT{100 + i}", "price": 500 + i, "status": "sold out: error" if i == 20 else "ok"}
        for i in range(40)
    ]
    lines = fact_lines(digest(searched(str(records), "search"), ROOM, COUNT))
    failed = [line for line in lines if "error" in line]
    assert failed, lines
    for line in failed:
        assert "HAT120" in line and "520" in line
        assert not re.search(r"HAT1(?!20)\d\d|5(?!20)\d\d", line), line
    for line in lines:
        assert len(re.findall(r"HAT\d+", line)) <= 1, line


# Records whose every value names its record (v<record>x<field>), in the shapes tools print.
FORMATS = {
    "json": lambda rs: json.dumps(rs),
    "compact": lambda rs: json.dumps(rs, separators=(",", ":")),
    "jsonl": lambda rs: "\n".join(json.dumps(r) for r in rs),
    "wrapped": lambda rs: json.dumps({"count": len(rs), "results": rs}),
    "indented": lambda rs: json.dumps(rs, indent=2),
    "repr": lambda rs: str(rs),
    "cut short": lambda rs: json.dumps(rs)[: len(json.dumps(rs)) * 4 // 5],  # a tool's limit hit
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=40), min_size=2, max_size=6),
    nested=st.booleans(),
    shape=st.sampled_from(sorted(FORMATS)),
    room=st.integers(min_value=60, max_value=ROOM),
)
def test_no_digest_line_mixes_the_values_of_two_records(
    sizes: list[int], nested: bool, shape: str, room: int
) -> None:
    records: list[dict[str, Any]] = []
    for r, size in enumerate(sizes):
        record: dict[str, Any] = {"id": f"rec{r}"}
        record.update({f"f{k}": f"v{r}x{k}" for k in range(size)})
        record["about"] = f"Booked as rec{r}. Paid."  # a sentence end inside a record
        if nested:
            record["sub"] = {"items": [f"v{r}x{100 + k}" for k in range(size)]}
        records.append(record)
    text = digest(searched(FORMATS[shape](records), "lookup"), room, COUNT)
    for line in text.splitlines():
        owners = set(re.findall(r"\bv(\d+)x", line)) | set(re.findall(r"\brec(\d+)", line))
        if len(owners) > 1:  # only a whole value may hold several records: nothing left out of it
            assert "…" not in line and line[2:].startswith("{"), line
            assert isinstance(json.loads(line[2:]), dict), line


def test_the_marker_of_a_dropped_search_states_each_flight_with_its_own_prices() -> None:
    # What the model reads after fit() dropped the turn that searched: a booking conversation
    # whose later turns push the search out of the budget.
    chatter = [  # without facts: the search is what the marker has to tell
        {"role": "user", "content": "and tell me about the rules for bags and meals " * 8},
        {"role": "assistant", "content": "sure, here is what the rules say about that " * 8},
    ]
    messages = [*chatter * 10, *searched(json.dumps(FLIGHTS)), *chatter * 20]
    messages.append({"role": "user", "content": "Book the cheapest economy seat, please."})
    result = fit(messages, model="gpt-4o", budget_tokens=3_000)
    marker = next(m for m in result.messages if "what they held" in str(m["content"]))
    named = [line for line in marker["content"].splitlines() if "HAT" in line]
    assert named, marker["content"]
    for line in named:
        (number,) = re.findall(r"HAT\d+", line)
        prices = next(f["prices"] for f in FLIGHTS if f["flight_number"] == number)
        if "economy" in line:
            assert f'"economy":{prices["economy"]}' in line.replace(" ", ""), line
