"""Error bodies exactly as the real providers send them.

The gateway classifies upstream errors (and learns context windows from
overflow messages) by parsing these bodies, so their wording and shape are
copied from the providers rather than invented.
"""

from __future__ import annotations

from typing import Any, Literal, assert_never, get_args

OverflowStyle = Literal["openai", "openai_new", "anthropic", "vllm", "llamacpp"]
OVERFLOW_STYLES: tuple[str, ...] = get_args(OverflowStyle)

NO_API_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header using "
    "Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the password field (with blank username) if "
    "you're accessing the API from your browser and are prompted for a username and password. You can "
    "obtain an API key from https://platform.openai.com/account/api-keys."
)
BAD_JSON = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your "
    "HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON. "
    "If you have trouble figuring out how to fix this, please contact us through our help center at "
    "help.openai.com.)"
)
SERVER_ERROR = "The server had an error while processing your request. Sorry about that!"
OVERLOADED = "The server is overloaded or not ready yet."
# OpenAI's 502s come from its CDN as an HTML page, not JSON: clients must cope with both.
BAD_GATEWAY_HTML = (
    "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    "<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>cloudflare</center>\r\n</body>\r\n</html>\r\n"
)


def openai_error(
    message: str, *, type: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def mask_key(key: str) -> str:
    """Mask an API key the way OpenAI echoes it back: first 8 and last 4 characters kept."""
    if len(key) <= 12:
        return key
    return key[:8] + "*" * (len(key) - 12) + key[-4:]


def wrong_api_key(key: str) -> dict[str, Any]:
    message = (
        f"Incorrect API key provided: {mask_key(key)}. "
        "You can find your API key at https://platform.openai.com/account/api-keys."
    )
    return openai_error(message, code="invalid_api_key")


def rate_limited(model: str, retry_after: float) -> dict[str, Any]:
    message = (
        f"Rate limit reached for {model} in organization org-fake on requests per min (RPM): "
        f"Limit 500, Used 500, Requested 1. Please try again in {retry_after:g}s. "
        "Visit https://platform.openai.com/account/rate-limits to learn more."
    )
    return openai_error(message, type="requests", code="rate_limit_exceeded")


def overflow(
    style: OverflowStyle, *, window: int, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """The 400 body a provider of `style` answers when prompt + completion exceed `window`."""
    requested = prompt_tokens + completion_tokens
    if style == "openai":
        if completion_tokens:
            message = (
                f"This model's maximum context length is {window} tokens. However, you requested {requested} "
                f"tokens ({prompt_tokens} in the messages, {completion_tokens} in the completion). "
                "Please reduce the length of the messages or completion."
            )
        else:
            message = (
                f"This model's maximum context length is {window} tokens. However, your messages resulted in "
                f"{prompt_tokens} tokens. Please reduce the length of the messages."
            )
        return openai_error(message, param="messages", code="context_length_exceeded")
    if style == "openai_new":
        message = (
            "Your input exceeds the context window of this model. Please adjust your input and try again."
        )
        return openai_error(message, param="input", code="context_length_exceeded")
    if style == "anthropic":
        if prompt_tokens > window:
            message = f"prompt is too long: {prompt_tokens} tokens > {window} maximum"
        else:
            message = (
                f"input length and `max_tokens` exceed context limit: {prompt_tokens} + {completion_tokens} "
                f"> {window}, decrease input length or `max_tokens` and try again"
            )
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    if style == "vllm":
        message = (
            f"This model's maximum context length is {window} tokens. However, you requested {requested} "
            f"tokens ({prompt_tokens} in the messages, {completion_tokens} in the completion). "
            "Please reduce the length of the messages or completion."
        )
        return {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
    if style == "llamacpp":
        return {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": prompt_tokens,
                "n_ctx": window,
            }
        }
    # Tests set the style at run time: a typo must fail loudly, not pick a style.
    assert_never(style)
