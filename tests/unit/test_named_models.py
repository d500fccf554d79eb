"""The models a pass-through body names, read as the upstream reads the body."""

from __future__ import annotations

import tracemalloc

import httpx
import pytest

from gateway.errors import GatewayError
from gateway.policy.named_models import models_named


def _form(data: dict[str, str], files: dict[str, tuple[str, bytes]]) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://upstream/", data=data, files=files)
    return request.read(), request.headers["content-type"]


def test_form_fields_file_parts_and_batch_files_name_their_models() -> None:
    assert models_named(*_form({"model": "whisper-1"}, {"file": ("a.wav", b"RIFF")})) == ["whisper-1"]
    assert models_named(*_form({}, {"model": ("m", b"gpt-x"), "file": ("a.wav", b"RIFF")})) == ["gpt-x"]
    lines = b'{"body": {"model": "a"}}\n\n{"body": {"model": "b"}}\n'
    assert models_named(*_form({"purpose": "batch"}, {"file": ("in.jsonl", lines)})) == ["a", "b"]
    assert models_named(*_form({"purpose": "fine-tune"}, {"file": ("in.jsonl", lines)})) == []
    assert models_named(b"input=x&model=a&model=b", "application/x-www-form-urlencoded") == ["a", "b"]
    assert models_named(b" " * 5000 + b'{"model": "c"}', "application/json") == ["c"]


def test_a_large_upload_is_read_in_place() -> None:
    """An upload of hundreds of megabytes is already in memory once: its parts are not copied."""
    body, content_type = _form({"purpose": "assistants"}, {"file": ("big.bin", b"\0" * 20_000_000)})
    tracemalloc.start()
    try:
        assert models_named(body, content_type) == []
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
        models_named(body, content_type)
    assert refused.value.status == 400
