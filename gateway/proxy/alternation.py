"""Upstreams whose chat template wants user and assistant turns to alternate.

A dropped span's marker is a user message of its own, beside another user
message. Strict APIs take that; the chat templates of Gemma and of several
Mistral models, applied by vLLM or llama.cpp, refuse it ("Conversation roles
must alternate user/assistant/user/assistant/...", vLLM's 400). Where such a
refusal answers a request whose markers went separate, the same fit goes again
with user messages in a row joined (`compression.markers: merged`), and the
model is remembered, so its next requests go merged at once. The memory is
the process's own (each worker learns with one refused request) and bounded:
model names come from clients.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import replace

from gateway.compress import CompressionOptions

MAX_MODELS = 1024
# vLLM answers the template's own exception text ("After the optional system message,
# conversation roles must alternate ..." for Mistral's tokenizer).
REFUSAL = re.compile(rb"roles must alternate", re.IGNORECASE)
REFUSAL_SCAN_BYTES = 4096  # an error body; the wording sits at its start


def refuses_separate_markers(status: int, body: bytes) -> bool:
    """Whether an upstream answer is a chat template refusing two user messages in a row."""
    return status >= 400 and REFUSAL.search(body[:REFUSAL_SCAN_BYTES]) is not None


class AlternatingModels:
    """Models an upstream refused separate markers for, most recent last."""

    def __init__(self, max_models: int = MAX_MODELS) -> None:
        self._models: OrderedDict[str, None] = OrderedDict()
        self._max_models = max_models

    def learn(self, model: str) -> None:
        self._models[model] = None
        self._models.move_to_end(model)
        while len(self._models) > self._max_models:
            self._models.popitem(last=False)

    def options(self, model: str, options: CompressionOptions) -> CompressionOptions:
        """The compression options for `model`: merged markers once its upstream refused separate ones."""
        if options.markers == "merged" or model not in self._models:
            return options
        return replace(options, markers="merged")

    def __len__(self) -> int:
        return len(self._models)
