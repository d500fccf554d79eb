"""Parse, validate and re-emit each wire format the gateway speaks.

- `chat.py`: validation of a chat-completions body, before anything else reads it;
- `anthropic.py` / `anthropic_validation.py`: Anthropic Messages (`system` + content blocks);
- `responses.py` / `responses_validation.py`: OpenAI Responses (`instructions` + input items);
- `base.py`: `ChatView` — a request's prompt as `gateway.compress` works on it (chat-shaped
  messages, tool definitions, output reserve) — the `WireFormat` protocol, and chat
  completions' own (identity) format; `fitting.py`: fit a request of any format.

A format's `emit` returns the request body with fitted messages written back in its own
shape. Messages that compress/ left untouched (the very same objects) are written back from
the original JSON, so nothing is lost on a round trip; changed ones keep every field they had.
"""
