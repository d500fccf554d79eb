"""The models a pass-through body names, read as the upstream reads the body, and the models of
a batch's input file, read as it streams from the upstream."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.errors import GatewayError
from gateway.policy.batch_input import creates_batch, input_file_id, input_file_models
from gateway.policy.named_models import FormScan, models_named


def _form(data: dict[str, str], files: dict[str, tuple[str, bytes]]) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://upstream/", data=data, files=files)
    return request.read(), request.headers["content-type"]


def _refused_by_form(
    body: bytes, content_type: str, allowed: set[str], cuts: list[int] | None = None
) -> str | None:
    """What FormScan answers for the body fed in the pieces `cuts` makes (whole by default)."""
    scan = FormScan(content_type, 1 << 20, allowed.__contains__)
    points = sorted({min(cut, len(body)) for cut in cuts or []})
    answers = [scan.feed(body[a:b]) for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    return next((answer for answer in answers if answer is not None), None) or scan.finish()


def test_form_fields_file_parts_and_batch_files_name_their_models() -> None:
    assert (
        _refused_by_form(*_form({"model": "whisper-1"}, {"file": ("a.wav", b"RIFF")}), set()) == "whisper-1"
    )
    assert (
        _refused_by_form(*_form({"model": "whisper-1"}, {"file": ("a.wav", b"RIFF")}), {"whisper-1"}) is None
    )
    assert (
        _refused_by_form(*_form({}, {"model": ("m", b"gpt-x"), "file": ("a.wav", b"RIFF")}), set()) == "gpt-x"
    )
    lines = b'{"body": {"model": "a"}}\n\n{"body": {"model": "b"}}\n'
    assert _refused_by_form(*_form({"purpose": "batch"}, {"file": ("in.jsonl", lines)}), {"a"}) == "b"
    assert _refused_by_form(*_form({"purpose": "batch"}, {"file": ("in.jsonl", lines)}), {"a", "b"}) is None
    assert _refused_by_form(*_form({"purpose": "fine-tune"}, {"file": ("in.jsonl", lines)}), set()) is None
    assert models_named(b"input=x&model=a&model=b", "application/x-www-form-urlencoded") == ["a", "b"]
    assert models_named(b" " * 5000 + b'{"model": "c"}', "application/json") == ["c"]


@given(
    models=st.lists(st.sampled_from(["ok", "also-ok", "forbidden"]), min_size=1, max_size=6),
    purpose_last=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=8),
)
def test_an_upload_fed_in_any_pieces_is_judged_as_it_is_whole(
    models: list[str], purpose_last: bool, cuts: list[int]
) -> None:
    """An upload streams in pieces that split its boundary, headers and lines anywhere, and its
    `purpose` may come after the file: read as it streams, the first model of a batch file the
    list refuses is found, and a file that is not a batch is never judged by its lines."""
    lines = b"\n".join(
        orjson.dumps({"custom_id": str(n), "body": {"model": m}}) for n, m in enumerate(models)
    )
    boundary = "b0undary"
    file_part = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
            "Content-Type: application/jsonl\r\n\r\n"
        ).encode()
        + lines
        + b"\r\n"
    )
    for purpose in ("batch", "assistants"):
        purpose_part = f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n{purpose}\r\n'
        parts = [file_part, purpose_part.encode()] if purpose_last else [purpose_part.encode(), file_part]
        body = b"".join(parts) + f"--{boundary}--\r\n".encode()
        content_type = f"multipart/form-data; boundary={boundary}"
        expected = "forbidden" if purpose == "batch" and "forbidden" in models else None
        assert _refused_by_form(body, content_type, {"ok", "also-ok"}, cuts) == expected


@pytest.mark.parametrize(
    "disposition",
    [
        b"form-data; name*=utf-8''model",
        b'form-data; name*0="mo"; name*1="del"',
        b'form-data; name="model"; name="x"',
        b'form-data; name="model"\r\nContent-Disposition: form-data; name="x"',
    ],
    ids=["rfc2231", "rfc2231-continued", "name-twice", "header-twice"],
)
def test_a_part_that_names_itself_ambiguously_is_refused(disposition: bytes) -> None:
    """Python's email parser reads each of these as the `model` field, the multipart parser here
    as no field at all: the part went upstream unchecked, naming a forbidden model."""
    body = b"--zz\r\nContent-Disposition: " + disposition + b"\r\n\r\ngpt-5-forbidden\r\n--zz--\r\n"
    with pytest.raises(GatewayError) as refused:
        _refused_by_form(body, "multipart/form-data; boundary=zz", {"whisper-1"})
    assert refused.value.status == 400 and refused.value.param == "content-disposition"


def test_what_parsers_disagree_on_is_refused_and_what_they_agree_on_is_read() -> None:
    """Two boundaries (aiohttp takes the first, the parser here the last) and a quoted escape in
    a part's name (`mod\\el` is `model` to aiohttp) hid a forbidden model; `Model` and `model[]`
    are `model` to some servers. A filename holding "; name=" is only a filename."""
    part = b'--A\r\nContent-Disposition: form-data; name="model"\r\n\r\ngpt-5-forbidden\r\n--A--\r\n'
    with pytest.raises(GatewayError) as two:
        _refused_by_form(part, "multipart/form-data; boundary=A; boundary=B", {"whisper-1"})
    assert two.value.param == "content-type"
    escaped = part.replace(b'name="model"', b'name="mod\\el"')
    with pytest.raises(GatewayError) as ambiguous:
        _refused_by_form(escaped, "multipart/form-data; boundary=A", {"whisper-1"})
    assert ambiguous.value.param == "content-disposition"
    for spelling in (b'name="Model"', b'name="model[]"', b'name="model "'):
        spelled = part.replace(b'name="model"', spelling)
        assert (
            _refused_by_form(spelled, "multipart/form-data; boundary=A", {"whisper-1"}) == "gpt-5-forbidden"
        )
    named = {"model": "whisper-1"}, {"file": ("meeting; name=bob.wav", b"RIFF")}
    assert _refused_by_form(*_form(*named), {"whisper-1"}) is None
    assert models_named(b"input=x&Model=a&model%5B%5D=b", "application/x-www-form-urlencoded") == ["a", "b"]


def test_a_batch_file_named_jsonl_is_read_as_one_before_its_purpose() -> None:
    """The OpenAI Node SDK sends the file before `purpose`: a batch line over 64 KiB (an image in
    base64) was refused. A file named .jsonl is read as JSON Lines from its first byte."""
    line = orjson.dumps({"custom_id": "a", "body": {"model": "gpt-4o-mini", "input": "x" * 200_000}})
    body = (
        b'--zz\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n'
        + line
        + b'\r\n--zz\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--zz--\r\n'
    )
    assert (
        _refused_by_form(body, "multipart/form-data; boundary=zz", {"gpt-4o-mini"}, [70_000, 140_000]) is None
    )
    assert (
        _refused_by_form(body, "multipart/form-data; boundary=zz", {"whisper-1"}, [70_000]) == "gpt-4o-mini"
    )


def test_a_file_without_lines_is_not_held_and_not_refused_unless_it_is_a_batch() -> None:
    """A 40 MB recording has no line breaks: read as a batch file it was refused ("Line 1 ... is
    longer than 33,554,432 bytes") and held whole. Before the form says batch a file is held a
    short line at a time; a batch file whose `purpose` comes after a long line is refused."""
    audio = b"\0" * 3_000_000
    for purpose in ("assistants", "batch"):
        body, content_type = _form({"purpose": purpose}, {"file": ("a.wav", audio)})
        if purpose == "assistants":
            scan = FormScan(content_type, 1 << 20, {"whisper-1"}.__contains__)
            tracemalloc.start()
            try:
                assert all(scan.feed(body[at : at + 65_536]) is None for at in range(0, len(body), 65_536))
                assert scan.finish() is None
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert peak < 500_000
        else:  # a batch file's line is held up to the line limit, then refused
            with pytest.raises(GatewayError, match="longer than"):
                _refused_by_form(body, content_type, {"whisper-1"})
    purpose_last = (  # not named as JSON Lines, so held a short line at a time until `purpose`
        b'--zz\r\nContent-Disposition: form-data; name="file"; filename="in.txt"\r\n\r\n'
        + b'{"body": {"model": "gpt-5-forbidden", "input": "'
        + b"x" * 100_000
        + b'"}}\r\n'
        + b'--zz\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--zz--\r\n'
    )
    with pytest.raises(GatewayError, match="before the file"):
        _refused_by_form(purpose_last, "multipart/form-data; boundary=zz", {"whisper-1"})
    padded = purpose_last.replace(b"\r\n\r\nbatch\r\n", b"\r\n\r\nBatch \r\n")
    with pytest.raises(GatewayError):  # a purpose an upstream may trim or fold is still a batch
        _refused_by_form(padded, "multipart/form-data; boundary=zz", {"whisper-1"})


def test_an_upload_is_read_holding_a_line_at_most() -> None:
    """An upload of hundreds of megabytes streams through: what is held is its small fields and
    one line of a batch file, not the upload."""
    line = orjson.dumps({"custom_id": "x", "body": {"model": "ok", "input": "y" * 500}})
    body, content_type = _form({"purpose": "batch"}, {"file": ("in.jsonl", b"\n".join([line] * 40_000))})
    assert len(body) > 20_000_000
    scan = FormScan(content_type, 1 << 20, {"ok"}.__contains__)
    tracemalloc.start()
    try:
        for start in range(0, len(body), 65_536):
            assert scan.feed(body[start : start + 65_536]) is None
        assert scan.finish() is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (
            b'--zz\r\nContent-Disposition: form-data; name="model"\r\n\r\ngpt-x',
            "multipart/form-data; boundary=zz",
        ),
        (b"--zz\r\nbroken", "multipart/form-data; boundary=zz"),
        (b"x", "multipart/form-data"),
        (b'{"model": NaN}', "application/json"),
        (b'{"model": ["a"]}', ""),
        (b'{"body": {"model": "a"}}\nnot json', None),
    ],
    ids=["cut-inside-a-part", "broken", "no-boundary", "lenient-json", "model-not-a-string", "batch-line"],
)
def test_a_body_that_cannot_be_read_whole_is_refused(body: bytes, content_type: str | None) -> None:
    if content_type is None:  # a batch file with a line that is not JSON
        body, content_type = _form({"purpose": "batch"}, {"file": ("in.jsonl", body)})
    with pytest.raises(GatewayError) as refused:
        if content_type.startswith("multipart/"):
            _refused_by_form(body, content_type, {"gpt-x", "a"})
        else:
            models_named(body, content_type)
    assert refused.value.status == 400


async def _file_models(chunks: list[bytes], max_line: int = 1 << 20) -> list[str]:
    async def stream() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    return [model async for model in input_file_models(stream(), max_line)]


@given(
    models=st.lists(st.text(min_size=1, max_size=12), max_size=8),
    blank=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=6),
)
def test_a_batch_file_streamed_in_any_chunks_names_what_it_names_whole(
    models: list[str], blank: bool, cuts: list[int]
) -> None:
    """The input file of a batch arrives in chunks that split lines (and UTF-8 characters) anywhere:
    read as it streams, it names the models it names read whole, the last line with or without its
    line break."""
    lines = [orjson.dumps({"custom_id": str(n), "body": {"model": m}}) for n, m in enumerate(models)]
    whole = (b"\n\n" if blank else b"\n").join(lines)
    points = sorted({min(cut, len(whole)) for cut in cuts})
    chunks = [whole[a:b] for a, b in zip([0, *points], [*points, len(whole)], strict=True)]
    assert asyncio.run(_file_models(chunks)) == models
    assert asyncio.run(_file_models([whole + b"\n"])) == models


def test_a_batch_file_line_that_is_not_json_or_too_long_is_refused_naming_the_file() -> None:
    good = b'{"body": {"model": "a"}}\n'
    with pytest.raises(GatewayError) as bad:
        asyncio.run(_file_models([good, b"{not json\n", good]))
    assert bad.value.param == "input_file_id" and "Line 2 " in bad.value.message
    with pytest.raises(GatewayError) as long:
        asyncio.run(_file_models([good, b'{"body": {"model": "' + b"x" * 5000], max_line=1000))
    assert long.value.param == "input_file_id" and "Line 2 " in long.value.message


def test_a_batch_is_read_only_where_it_is_created_and_only_by_a_plain_file_id() -> None:
    assert creates_batch("POST", "/v1/batches") and creates_batch("POST", "//v1//batches/")
    assert not creates_batch("GET", "/v1/batches") and not creates_batch("POST", "/v1/batches/b1/cancel")
    assert input_file_id(b' {"input_file_id": "file-Ab_9", "endpoint": "/v1/embeddings"}') == "file-Ab_9"
    for body in (b'{"input_file_id": "../files"}', b'{"input_file_id": 3}', b"{}", b"[]", b'"file-a"'):
        with pytest.raises(GatewayError) as refused:
            input_file_id(body)
        assert refused.value.status == 400 and refused.value.param == "input_file_id"
    with pytest.raises(GatewayError):
        input_file_id(b"input_file_id=file-a")


def test_a_model_named_at_any_depth_of_a_json_body_is_read() -> None:
    """An eval run names its model in `data_source.model`, a grader in `grader.model`, a Message
    Batch in each request's params: read only at the top, each ran a model the list forbids."""
    run = {"name": "r", "data_source": {"type": "completions", "model": "o3", "source": {"type": "file_id"}}}
    assert models_named(orjson.dumps(run), "application/json") == ["o3"]
    grader = {"grader": {"type": "score_model", "model": "gpt-5", "input": []}, "model_sample": "x"}
    assert models_named(orjson.dumps(grader), "application/json") == ["gpt-5"]
    batch = {"requests": [{"custom_id": str(n), "params": {"model": m}} for n, m in enumerate("ab")]}
    assert models_named(orjson.dumps({"model": "top", **batch}), "application/json") == ["top", "a", "b"]
    deep = b'{"a":' * 900 + b'{"model": "deep"}' + b"}" * 900  # deeper than Python recursion
    assert models_named(deep, "application/json") == ["deep"]
    with pytest.raises(GatewayError) as refused:
        models_named(b'{"model": 5}', "application/json")
    assert refused.value.param == "model"


def test_an_object_naming_a_key_twice_is_refused() -> None:
    """orjson keeps the last of two equal keys; an upstream keeping the first would run a model the
    list never saw, directly or one level up (fuzzed: a batch's `input_file_id`, a batch line's
    `body`, a Message Batch's `requests`, an eval's `data_source`, each given twice). Twice in one
    object, plainly or with an escape, fails closed; once per object (each request of a batch, a
    tool's `model` parameter) does not."""
    for body, key in (
        (b'{"model": "allowed", "model": "forbidden"}', "model"),
        (b'{"model": "allowed", "mod\\u0065l": "forbidden"}', "model"),
        (b'{"requests": [{"params": {"model": "a", "model": "b"}}]}', "model"),
        (b'{"input_file_id": "file-ok", "input_file_id": "file-bad"}', "input_file_id"),
        (b'{"requests": [{"params": {"model": "a"}}], "requests": []}', "requests"),
        (b'{"data_source": {"model": "x"}, "data_source": {"model": "y"}}', "data_source"),
    ):
        with pytest.raises(GatewayError) as refused:
            models_named(body, "application/json")
        assert refused.value.status == 400 and refused.value.param == key
    schema = {"model": "a", "tools": [{"parameters": {"properties": {"model": {"type": "string"}}}}]}
    assert models_named(orjson.dumps(schema), "application/json") == ["a"]
    for line in (b'{"body": {"model": "a", "model": "b"}}\n', b'{"body": {"model": "a"}, "body": {}}\n'):
        with pytest.raises(GatewayError):
            asyncio.run(_file_models([line]))


def test_json_nested_past_what_the_key_check_reads_is_refused_not_a_500() -> None:
    """orjson reads 1,024 levels, Python's parser (which sees every object's keys) fewer: a body
    between the two is refused, unchecked, never passed and never a 500."""
    for depth in (1_000, 1_020, 5_000):
        body = b'{"a":' * depth + b'{"model": "gpt-5-forbidden"}' + b"}" * depth
        with pytest.raises(GatewayError) as refused:
            models_named(body, "application/json")
        assert refused.value.status == 400
