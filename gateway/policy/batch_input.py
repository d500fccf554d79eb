"""The models an OpenAI batch runs, read from its input file when the batch is created.

An OpenAI batch names no model itself: each line of its input file does. The file reaches the
upstream by any route — `POST /v1/files` (read as it is uploaded, gateway.policy.named_models),
the Uploads API in parts, or any other client holding the same upstream key — so for a team
held to a model allow-list the file is read where it is used: `POST /v1/batches` names it, and
its lines are checked before the batch is created. Pure parts here; the route fetches the file.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterator

import orjson

from gateway.errors import GatewayError
from gateway.policy.named_models import LineSplitter, batch_line_models

BATCHES_PATH = "/v1/batches"
# OpenAI's file ids are `file-` and letters and digits. The id becomes a path segment of the
# request that fetches the file, with the team's key: nothing that could name another resource.
_FILE_ID = re.compile(r"[A-Za-z0-9_-]{1,200}")
_SLASHES = re.compile(r"/+")


def creates_batch(method: str, path: str) -> bool:
    """Whether the request (its decoded path) creates an OpenAI batch."""
    return method == "POST" and _SLASHES.sub("/", path).rstrip("/") == BATCHES_PATH


def input_file_id(body: bytes) -> str:
    """The `input_file_id` of a batch's creation body: an object naming the file by its id."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise GatewayError(400, "The request body is not valid JSON.") from None
    file_id = payload.get("input_file_id") if isinstance(payload, dict) else None
    if not isinstance(file_id, str) or not _FILE_ID.fullmatch(file_id):
        raise GatewayError(
            400,
            "'input_file_id' must be the id of an uploaded file (letters, digits, '-' and '_'): "
            "the gateway reads it to check the models the batch runs.",
            param="input_file_id",
        )
    return file_id


async def input_file_models(chunks: AsyncIterator[bytes], max_line_bytes: int) -> AsyncGenerator[str, None]:
    """Every model the lines of a batch input file name, as the file streams in (one line held
    at a time, at most `max_line_bytes`)."""
    lines = LineSplitter(max_line_bytes, "the batch's input file", "input_file_id")
    async for chunk in chunks:
        for number, line in lines.feed(chunk):
            for model in batch_line_models(line, number, param="input_file_id"):
                yield model
    number, last = lines.finish()
    for model in batch_line_models(last, number, param="input_file_id"):
        yield model
