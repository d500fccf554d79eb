"""Each wire format to and from what `gateway.compress` works on: a chat-shaped message list.

- `base.py`: `ChatView` (the chat-shaped messages, tool definitions and output
  reserve of a request, for counting and fitting) and the `WireFormat` protocol;
- `chat.py`: chat completions (the view is the body itself);
- `anthropic.py`: Anthropic Messages (`system` + content blocks);
- `responses.py`: OpenAI Responses (`instructions` + input items).

A format's `emit` returns the request body with fitted messages written back
in its own shape. Messages that compress/ left untouched (the very same
objects) are written back from the original JSON, byte for byte once encoded,
so nothing is lost on a round trip; changed ones keep every field they had.
"""

from gateway.wire.base import ChatView, WireFormat

__all__ = ["ChatView", "WireFormat"]
