"""Recognising a chat template's refusal of two user messages in a row, and remembering its model."""

from __future__ import annotations

import orjson
import pytest

from gateway.compress import CompressionOptions
from gateway.proxy.alternation import MAX_MODELS, AlternatingModels, refuses_separate_markers


@pytest.mark.parametrize(
    ("status", "message", "refused"),
    [
        (400, "Conversation roles must alternate user/assistant/user/assistant/...", True),
        (400, "After the optional system message, conversation roles must alternate user/assistant", True),
        (500, "TemplateError: Conversation roles must alternate user/assistant/user/assistant/...", True),
        (400, "This model's maximum context length is 8192 tokens.", False),
        (200, "roles must alternate", False),
    ],
)
def test_a_template_refusal_is_told_from_other_answers(status: int, message: str, refused: bool) -> None:
    body = orjson.dumps({"object": "error", "message": message, "type": "BadRequestError", "code": status})
    assert refuses_separate_markers(status, body) is refused


def test_a_refused_model_goes_merged_and_the_memory_is_bounded() -> None:
    models = AlternatingModels()
    separate = CompressionOptions()
    models.learn("gemma-3-27b")
    assert models.options("gemma-3-27b", separate).markers == "merged"
    assert models.options("gpt-4o", separate) is separate
    for n in range(MAX_MODELS):
        models.learn(f"client-named-{n}")
    assert len(models) == MAX_MODELS
    assert models.options("gemma-3-27b", separate) is separate, "the oldest is forgotten first"
