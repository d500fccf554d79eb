"""Classification of upstream "context length exceeded" answers, on the bodies upstreams really send."""

from __future__ import annotations

import json
import time

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.proxy import overflow
from gateway.proxy.overflow import (
    Overflow,
    classify_overflow,
    classify_stream_error,
    detect_silent_truncation,
    overflow_error_body,
)


def openai_error(
    message: str, *, code: str | None = "context_length_exceeded", param: str | None = None
) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}
    )


def vllm_error(message: str) -> bytes:
    return orjson.dumps(
        {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
    )


def anthropic_error(message: str) -> bytes:
    return orjson.dumps(
        {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": message},
            "request_id": "req_011CVQe1dLrGNMJyE1ghG1av",
        }
    )


def gemini_error(message: str) -> bytes:
    # Gemini's OpenAI-compatible endpoint wraps its error in a list.
    return orjson.dumps(
        [
            {
                "error": {
                    "code": 400,
                    "message": message,
                    "errors": [{"message": message, "domain": "global", "reason": "badRequest"}],
                    "status": "INVALID_ARGUMENT",
                }
            }
        ]
    )


# (case id, status, body, window, prompt_tokens, requested_output, source, input_limit)
POSITIVE: list[tuple[str, int, bytes, int | None, int | None, int | None, str, bool]] = [
    (
        "openai-messages",
        400,
        openai_error(
            "This model's maximum context length is 128000 tokens. However, your messages resulted in 130912 "
            "tokens. Please reduce the length of the messages.",
            param="messages",
        ),
        128000,
        130912,
        None,
        "openai-messages",
        False,
    ),
    (
        "openai-messages-with-functions",
        400,
        openai_error(
            "This model's maximum context length is 128000 tokens. However, your messages resulted in 202868 "
            "tokens (202767 in the messages, 101 in the functions). Please reduce the length of the messages "
            "or functions.",
            param="messages",
        ),
        128000,
        202868,
        None,
        "openai-messages",
        False,
    ),
    (
        "azure-openai-requested",
        400,
        openai_error(
            "This model's maximum context length is 4096 tokens. However, you requested 4118 tokens (3118 in "
            "the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
            param="messages",
        ),
        4096,
        3118,
        1000,
        "openai-requested",
        False,
    ),
    (
        "openai-requested-with-functions",
        400,
        openai_error(
            "This model's maximum context length is 8192 tokens. However, you requested 8213 tokens (6683 in "
            "the messages, 730 in the functions, and 800 in the completion). Please reduce the length of the "
            "messages, functions, or completion.",
            param="messages",
        ),
        8192,
        7413,
        800,
        "openai-requested",
        False,
    ),
    (
        "openai-legacy-completions",
        400,
        openai_error(
            "This model's maximum context length is 4097 tokens, however you requested 4231 tokens (3975 in "
            "your prompt; 256 for the completion). Please reduce your prompt; or completion length.",
            code=None,
        ),
        4097,
        3975,
        256,
        "openai-requested",
        False,
    ),
    (
        "deepseek",
        400,
        openai_error(
            "This model's maximum context length is 65536 tokens. However, you requested 72814 tokens (68718 "
            "in the messages, 4096 in the completion). Please reduce the length of the messages or "
            "completion.",
            code="invalid_request_error",
        ),
        65536,
        68718,
        4096,
        "openai-requested",
        False,
    ),
    (
        "openai-input-window",
        400,
        openai_error(
            "Your input exceeds the context window of this model. Please adjust your input and try again.",
            param="input",
        ),
        None,
        None,
        None,
        "openai-context-window",
        False,
    ),
    (
        "azure-input-limit",
        400,
        openai_error(
            "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted in 509178 "
            "tokens. Please reduce the length of the messages.",
            param="messages",
        ),
        272000,
        509178,
        None,
        "openai-input-limit",
        True,
    ),
    (
        "anthropic-prompt",
        400,
        anthropic_error("prompt is too long: 208310 tokens > 200000 maximum"),
        200000,
        208310,
        None,
        "anthropic-prompt",
        False,
    ),
    (
        "anthropic-max-tokens",
        400,
        anthropic_error(
            "input length and `max_tokens` exceed context limit: 178959 + 64000 > 200000, decrease input "
            "length or `max_tokens` and try again"
        ),
        200000,
        178959,
        64000,
        "anthropic-max-tokens",
        False,
    ),
    (
        "anthropic-openai-compatible-endpoint",
        400,
        openai_error("prompt is too long: 211180 tokens > 200000 maximum", code=None),
        200000,
        211180,
        None,
        "anthropic-prompt",
        False,
    ),
    (
        "anthropic-relayed-as-500",
        500,
        b'{"error": "Prompt is too long: 200348 tokens > 200000 maximum"}',
        200000,
        200348,
        None,
        "anthropic-prompt",
        False,
    ),
    (
        "openrouter-text-input",
        400,
        orjson.dumps(
            {
                "error": {
                    "message": "This endpoint's maximum context length is 32768 tokens. However, you "
                    "requested about 42832 tokens (42832 of text input). Please reduce the length of either "
                    'one, or use the "middle-out" transform to compress your prompt automatically.',
                    "code": 400,
                }
            }
        ),
        32768,
        42832,
        None,
        "openrouter",
        False,
    ),
    (
        "openrouter-with-output",
        400,
        orjson.dumps(
            {
                "error": {
                    "message": "This endpoint's maximum context length is 131072 tokens. However, you "
                    "requested about 140000 tokens (139000 of text input, 1000 in the output). Please reduce "
                    "the length of either one.",
                    "code": 400,
                }
            }
        ),
        131072,
        139000,
        1000,
        "openrouter",
        False,
    ),
    (
        "openrouter-provider-error-raw",
        400,
        orjson.dumps(
            {
                "error": {
                    "message": "Provider returned error",
                    "code": 400,
                    "metadata": {
                        "raw": json.dumps(
                            {
                                "error": {
                                    "message": "This model's maximum context length is 262144 tokens. "
                                    "However, your messages resulted in 262897 tokens. Please reduce the "
                                    "length of the messages.",
                                    "type": "Bad Request",
                                    "code": 400,
                                }
                            }
                        ),
                        "provider_name": "Nvidia",
                    },
                }
            }
        ),
        262144,
        262897,
        None,
        "openai-messages",
        False,
    ),
    (
        "vllm-old",
        400,
        vllm_error(
            "This model's maximum context length is 131072 tokens. However, you requested 156632 tokens "
            "(152536 in the messages, 4096 in the completion). Please reduce the length of the messages or "
            "completion."
        ),
        131072,
        152536,
        4096,
        "openai-requested",
        False,
    ),
    (
        "vllm-no-breakdown",
        400,
        vllm_error(
            "This model's maximum context length is 131072 tokens. However, you requested 351430 tokens. "
            "Please reduce the length of the messages or completion."
        ),
        131072,
        None,
        None,
        "openai-requested",
        False,
    ),
    (
        "vllm-output",
        400,
        vllm_error(
            "This model's maximum context length is 131072 tokens. However, you requested 1024 output tokens "
            "and your prompt contains at least 130049 input tokens, for a total of at least 131073 tokens. "
            "Please reduce the length of the input prompt or the number of requested output tokens. "
            "(parameter=input_tokens, value=130049)"
        ),
        131072,
        130049,
        1024,
        "vllm-output",
        False,
    ),
    (
        "vllm-output-characters",
        400,
        orjson.dumps(
            {
                "error": {
                    "message": "This model's maximum context length is 4096 tokens. However, you requested "
                    "4096 output tokens and your prompt contains 581 characters (more than 0 characters, "
                    "which is the upper bound for 0 input tokens).",
                    "code": 400,
                }
            }
        ),
        4096,
        None,
        4096,
        "vllm-output",
        False,
    ),
    (
        "vllm-prompt-too-long",
        400,
        orjson.dumps(
            {
                "error": {
                    "object": "error",
                    "message": "The prompt (total length 6287) is too long to fit into the model (context "
                    "length 4096). Make sure that `max_model_len` is no smaller than the number of text "
                    "tokens plus multimodal tokens.",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            }
        ),
        4096,
        6287,
        None,
        "vllm-prompt-too-long",
        False,
    ),
    (
        "vllm-decoder",
        400,
        vllm_error(
            "The decoder prompt (length 12324) is longer than the maximum model length of 8192. Make sure "
            "that `max_model_len` is no smaller than the number of text tokens."
        ),
        8192,
        12324,
        None,
        "vllm-decoder",
        False,
    ),
    (
        "vllm-legacy-plain-text",
        400,
        b"Input prompt (15681 tokens) is too long and exceeds limit of 2560",
        2560,
        15681,
        None,
        "vllm-legacy",
        False,
    ),
    (
        "sglang",
        400,
        b'{"object":"error","message":"The input (61709 tokens) is longer than the model\'s context length '
        b'(40960 tokens).","type":"BadRequestError","param":null,"code":400}',
        40960,
        61709,
        None,
        "sglang",
        False,
    ),
    (
        "together-sglang-engine",
        400,
        openai_error(
            "The input (516368 tokens) is longer than the model's context length (262144 tokens).", code=None
        ),
        262144,
        516368,
        None,
        "sglang",
        False,
    ),
    (
        "sglang-input-length",
        400,
        vllm_error("Input length (160062 tokens) exceeds the maximum allowed length (59862 tokens)."),
        59862,
        160062,
        None,
        "sglang-input-length",
        False,
    ),
    (
        "llamacpp-400-fields",
        400,
        b'{"error":{"code":400,"message":"the request exceeds the available context size. try increasing '
        b'the context size or enable context shift","type":"exceed_context_size_error",'
        b'"n_prompt_tokens":14429,"n_ctx":8192}}',
        8192,
        14429,
        None,
        "llamacpp",
        False,
    ),
    (
        "llamacpp-500-fields",
        500,
        b'{"error":{"code":500,"message":"the request exceeds the available context size. try increasing '
        b'the context size or enable context shift","type":"exceed_context_size_error",'
        b'"n_prompt_tokens":1407,"n_ctx":256}}',
        256,
        1407,
        None,
        "llamacpp",
        False,
    ),
    (
        "llamacpp-counts-in-message",
        400,
        b'{"error":{"code":400,"message":"request (25837 tokens) exceeds the available context size (25088 '
        b'tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":25837,'
        b'"n_ctx":25088}}',
        25088,
        25837,
        None,
        "llamacpp",
        False,
    ),
    (
        "llamacpp-type-only",
        400,
        b'{"error":{"code":400,"message":"failed","type":"exceed_context_size_error","n_prompt_tokens":9000,'
        b'"n_ctx":4096}}',
        4096,
        9000,
        None,
        "llamacpp",
        False,
    ),
    (
        "ds4-fields",
        400,
        b'{"error":{"message":"Prompt tokens (9000) exceeds context size (8192)","type":"context_exceeded",'
        b'"n_prompt_tokens":9000,"n_ctx":8192}}',
        8192,
        9000,
        None,
        "ds4",
        False,
    ),
    (
        "ds4-configured-context",
        400,
        openai_error(
            "Prompt has 5,958,968 tokens, but the configured context size is 256,000 tokens", code=None
        ),
        256000,
        5958968,
        None,
        "ds4",
        False,
    ),
    (
        "ollama-openai-endpoint",
        400,
        b'{"error":{"message":"the input length exceeds the context length","type":"invalid_request_error",'
        b'"param":null,"code":null}}',
        None,
        None,
        None,
        "ollama-input",
        False,
    ),
    (
        "ollama-native-500",
        500,
        b'{"error":"the input length exceeds the context length"}',
        None,
        None,
        None,
        "ollama-input",
        False,
    ),
    (
        "ollama-with-window",
        400,
        b'{"error":"the input length exceeds the context length of 4096"}',
        4096,
        None,
        None,
        "ollama-input",
        False,
    ),
    (
        "ollama-embed",
        400,
        b'{"error":"input length exceeds maximum context length"}',
        None,
        None,
        None,
        "ollama-input",
        False,
    ),
    (
        "ollama-truncate-false",
        400,
        b'{"error":"prompt too long; exceeded max context length by 100918 tokens"}',
        None,
        None,
        None,
        "ollama-prompt",
        False,
    ),
    (
        "gemini-list-wrapped",
        400,
        gemini_error(
            "The input token count (1200293) exceeds the maximum number of tokens allowed (1048576)."
        ),
        1048576,
        1200293,
        None,
        "gemini",
        True,
    ),
    (
        "gemini-no-count",
        400,
        gemini_error("The input token count exceeds the maximum number of tokens allowed (1048576)."),
        1048576,
        None,
        None,
        "gemini",
        True,
    ),
    (
        "gemini-plain-object",
        400,
        b'{"error":{"code":400,"message":"The input token count (132478) exceeds the maximum number of '
        b'tokens allowed (131072).","status":"INVALID_ARGUMENT"}}',
        131072,
        132478,
        None,
        "gemini",
        True,
    ),
    (
        "mistral",
        400,
        b'{"object":"error","message":"Prompt contains 159202 tokens and 0 draft tokens, too large for '
        b'model with 131072 maximum context length","type":"invalid_request_invalid_args","param":null,'
        b'"code":"3051","raw_status_code":400}',
        131072,
        159202,
        None,
        "mistral",
        False,
    ),
    (
        "mistral-code-only",
        400,
        b'{"object":"error","message":"Bad request","type":"invalid_request_invalid_args","param":null,'
        b'"code":"3051"}',
        None,
        None,
        None,
        "mistral",
        False,
    ),
    (
        "groq",
        400,
        openai_error("Please reduce the length of the messages or completion.", param="messages"),
        None,
        None,
        None,
        "groq",
        False,
    ),
    (
        "together-tgi",
        400,
        b'{"error":{"message":"Input validation error: `inputs` tokens + `max_new_tokens` must be <= 8193. '
        b'Given: 9000 `inputs` tokens and 512 `max_new_tokens`","type":"invalid_request_error"}}',
        8193,
        9000,
        512,
        "together-tgi",
        False,
    ),
    (
        "tgi-422-plain",
        422,
        b'{"error":"Input validation error: `inputs` tokens + `max_new_tokens` must be <= 65537. Given: '
        b'79993 `inputs` tokens and 1024 `max_new_tokens`","error_type":"validation"}',
        65537,
        79993,
        1024,
        "together-tgi",
        False,
    ),
    (
        "tgi-inputs",
        422,
        b'{"error":"Input validation error: `inputs` must have less than 4096 tokens. Given: 4545",'
        b'"error_type":"validation"}',
        4096,
        4545,
        None,
        "tgi-inputs",
        True,
    ),
    (
        "xai-string-error",
        400,
        b'{"code":"Client specified an invalid argument","error":"This model\'s maximum prompt length is '
        b'131072 but the request contains 149617 tokens."}',
        131072,
        149617,
        None,
        "xai",
        True,
    ),
    (
        "cerebras",
        400,
        openai_error(
            "Please reduce the length of the messages or completion. "
            "Current length is 42328 while limit is 40000"
        ),
        40000,
        None,
        None,
        "cerebras",
        False,
    ),
    (
        "kimi",
        400,
        openai_error("Your request exceeded model token limit: 262144 (requested: 300000)", code=None),
        262144,
        None,
        None,
        "kimi",
        False,
    ),
    (
        "copilot",
        400,
        openai_error(
            "prompt token count of 90000 exceeds the limit of 65536", code="model_max_prompt_tokens"
        ),
        65536,
        90000,
        None,
        "copilot",
        False,
    ),
    (
        "poolside",
        400,
        openai_error(
            "Input length 131393 exceeds the maximum allowed input length of 131040 tokens.", code=None
        ),
        131040,
        131393,
        None,
        "poolside",
        True,
    ),
    (
        "openai-compatible-parenthesised",
        400,
        openai_error("Input length (265330) exceeds model's maximum context length (262144).", code=None),
        262144,
        265330,
        None,
        "openai-compatible",
        False,
    ),
    (
        "openai-compatible-requested-count",
        400,
        openai_error(
            "Requested token count exceeds the model's maximum context length of 131072 tokens.", code=None
        ),
        131072,
        None,
        None,
        "openai-compatible",
        False,
    ),
    (
        "lmstudio-keep",
        400,
        b'{"error":"Trying to keep the first 5210 tokens when context the overflows. However, the model is '
        b"loaded with context length of only 4096 tokens, which is not enough. Try to load the model with a "
        b'larger context length, or provide a shorter input"}',
        4096,
        5210,
        None,
        "lmstudio",
        False,
    ),
    (
        "lmstudio-old",
        400,
        b'{"error":"Input length 1581 exceeds context length 1500"}',
        1500,
        1581,
        None,
        "lmstudio",
        False,
    ),
    (
        "lmstudio-tokens-to-keep",
        400,
        b'{"error":"The number of tokens to keep from the initial prompt is greater than the context '
        b'length"}',
        None,
        None,
        None,
        "lmstudio",
        False,
    ),
    (
        "dashscope",
        400,
        openai_error("Range of input length should be [1, 129024]", code="invalid_parameter_error"),
        129024,
        None,
        None,
        "dashscope",
        True,
    ),
    (
        "minimax",
        400,
        b'{"base_resp":{"status_code":2013,"status_msg":"invalid params, context window exceeds limit"}}',
        None,
        None,
        None,
        "minimax",
        False,
    ),
    (
        "litellm-wrapping-anthropic",
        400,
        b'{"error":{"message":"litellm.BadRequestError: litellm.ContextWindowExceededError: AnthropicError '
        b'- {\\"type\\":\\"error\\",\\"error\\":{\\"type\\":\\"invalid_request_error\\",'
        b'\\"message\\":\\"prompt is too long: 200480 tokens > 200000 maximum\\"}}\\nReceived Model '
        b'Group=anthropic/claude-3-5-sonnet\\nAvailable Model Group Fallbacks=None","type":null,'
        b'"param":null,"code":"400"}}',
        200000,
        200480,
        None,
        "anthropic-prompt",
        False,
    ),
    (
        "litellm-bytes-repr",
        400,
        b'{"error":{"message":"litellm.BadRequestError: AnthropicException - b\'{\\"type\\":\\"error\\",'
        b'\\"error\\":{\\"type\\":\\"invalid_request_error\\",\\"message\\":\\"input length and '
        b"`max_tokens` exceed context limit: 179413 + 32768 > 200000, decrease input length or `max_tokens` "
        b'and try again\\"}}\'. Received Model Group=anthropic/claude-sonnet-4","type":null,"param":null,'
        b'"code":"400"}}',
        200000,
        179413,
        32768,
        "anthropic-max-tokens",
        False,
    ),
    (
        "litellm-python-repr-apostrophe",
        400,
        b'{"error":{"message":"litellm.BadRequestError: OpenAIException - {\'error\': {\'message\': \\"This '
        b"model\\\\'s maximum context length is 8192 tokens. However, your messages resulted in 8202 "
        b'tokens.\\"}}","type":null,"param":null,"code":"400"}}',
        8192,
        8202,
        None,
        "openai-messages",
        False,
    ),
    (
        "litellm-no-numbers",
        400,
        b'{"error":{"message":"litellm.BadRequestError: litellm.ContextWindowExceededError: '
        b'BedrockException: Context Window Error - {\\"message\\":\\"Input is too long for requested '
        b'model.\\"}","type":null,"param":null,"code":"400"}}',
        None,
        None,
        None,
        "litellm",
        False,
    ),
    (
        "openai-window-fallback",
        400,
        b"ValidationException: This model's maximum context length is 8192 tokens. Please reduce the length "
        b"of the prompt",
        8192,
        None,
        None,
        "openai-window",
        False,
    ),
    (
        "oobabooga",
        400,
        openai_error(
            "This model maximum context length is 2048 tokens. However, your messages resulted in over 2190 "
            "tokens.",
            code=None,
        ),
        2048,
        2190,
        None,
        "openai-messages",
        False,
    ),
    (
        "zhipu-prompt-too-long",
        400,
        b'{"error":{"code":"1261","message":"Prompt too long"}}',
        None,
        None,
        None,
        "prompt-too-long",
        False,
    ),
    (
        "openai-code-only",
        400,
        openai_error("Invalid request.", param="messages"),
        None,
        None,
        None,
        "context-length-exceeded",
        False,
    ),
    (
        "openrouter-metadata-error-type",
        400,
        b'{"error":{"message":"Too long.","code":400,"metadata":{"error_type":"context_length_exceeded"}}}',
        None,
        None,
        None,
        "context-length-exceeded",
        False,
    ),
    (
        "plain-text-lowercased",
        400,
        b"400 this model's maximum context length is 65536 tokens. however, you requested 69648 tokens "
        b"(69648 in the messages, 0 in the completion). please reduce the length of the messages or "
        b"completion.",
        65536,
        69648,
        0,
        "openai-requested",
        False,
    ),
    (
        "message-wrapped-over-lines",
        400,
        anthropic_error(
            "input length and `max_tokens` exceed context limit: \n     189136 + 20000 > 204648, decrease "
            "input length or `max_tokens` and try again"
        ),
        204648,
        189136,
        20000,
        "anthropic-max-tokens",
        False,
    ),
]


@pytest.mark.parametrize(
    ("status", "body", "window", "prompt", "output", "source", "input_limit"),
    [case[1:] for case in POSITIVE],
    ids=[case[0] for case in POSITIVE],
)
def test_recognises_real_overflow_bodies(
    status: int,
    body: bytes,
    window: int | None,
    prompt: int | None,
    output: int | None,
    source: str,
    input_limit: bool,
) -> None:
    assert classify_overflow(status, body) == Overflow(
        window=window, prompt_tokens=prompt, requested_output=output, source=source, input_limit=input_limit
    )


def test_every_rule_has_a_real_body() -> None:
    covered = {case[6] for case in POSITIVE}
    sources = {rule.source for rule in overflow._RULES if not rule.exclude}
    assert sources <= covered, f"rules without a test body: {sorted(sources - covered)}"


NEGATIVE: list[tuple[str, int, bytes]] = [
    (
        "openai-rate-limit-429",
        429,
        openai_error(
            "Rate limit reached for gpt-4o in organization org-abc on tokens per min (TPM): Limit 30000, "
            "Used 25000, Requested 45000. Please try again in 30s.",
            code="rate_limit_exceeded",
        ),
    ),
    (
        "openai-request-too-large-429",
        429,
        openai_error(
            "Request too large for gpt-4 in organization org-abc on tokens per min (TPM): Limit 10000, "
            "Requested 12000. The input or output tokens must be reduced in order to run successfully.",
            code="rate_limit_exceeded",
        ),
    ),
    (
        "openai-request-too-large-413",
        413,
        openai_error(
            "Request too large for gpt-4 in organization org-abc on tokens per min (TPM): Limit 10000, "
            "Requested 12000. The input or output tokens must be reduced in order to run successfully.",
            code="rate_limit_exceeded",
        ),
    ),
    (
        "groq-tpm-413",
        413,
        b'{"error":{"message":"Request too large for model `llama-3.1-8b-instant` in organization `org_x` '
        b"service tier `on_demand` on tokens per minute (TPM): Limit 6000, Requested 9512, please reduce "
        b'your message size and try again.","type":"tokens","code":"rate_limit_exceeded"}}',
    ),
    (
        "nginx-413",
        413,
        b"<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n<center><h1>413 "
        b"Request Entity Too Large</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n",
    ),
    (
        "anthropic-request-too-large-413",
        413,
        b'{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum size"}}',
    ),
    (
        "openai-string-too-long",
        400,
        openai_error(
            "Invalid 'messages[1].content': string too long. Expected a string with maximum length 10485760, "
            "but got a string with length 20000000 instead.",
            code="string_above_max_length",
            param="messages[1].content",
        ),
    ),
    (
        "litellm-string-too-long",
        400,
        b'{"error":{"message":"litellm.BadRequestError: litellm.ContextWindowExceededError: OpenAIException '
        b"- Invalid 'messages[1].content': string too long. Expected a string with maximum length 10485760, "
        b'but got a string with length 20000000 instead.","type":null,"param":null,"code":"400"}}',
    ),
    (
        "openai-max-tokens-too-large",
        400,
        openai_error(
            "max_tokens is too large: 20000. This model supports at most 16384 completion tokens, whereas "
            "you provided 20000.",
            code="invalid_value",
            param="max_tokens",
        ),
    ),
    (
        "anthropic-max-tokens-too-large",
        400,
        anthropic_error(
            "max_tokens: 10000 > 4096, which is the maximum allowed number of output tokens for "
            "claude-3-5-sonnet-20240620"
        ),
    ),
    (
        "tgi-max-new-tokens",
        422,
        b'{"error":"Input validation error: `max_new_tokens` must be <= 192. Given: 200",'
        b'"error_type":"validation"}',
    ),
    ("vllm-negative-max-tokens", 400, vllm_error("max_tokens must be at least 1, got -186.")),
    (
        "ollama-load-failure",
        500,
        b'{"error":"requested context size too large for model"}',
    ),
    (
        "request-echoed-by-validation",
        422,
        orjson.dumps(
            {
                "detail": [
                    {
                        "type": "missing",
                        "loc": ["body", "model"],
                        "msg": "Field required",
                        "input": {
                            "messages": [
                                {
                                    "role": "user",
                                    "content": "Why do I get: This model's maximum context length is 4096 "
                                    "tokens. However, your messages resulted in 5000 tokens?",
                                }
                            ]
                        },
                    }
                ]
            }
        ),
    ),
    (
        "success-quoting-an-overflow",
        200,
        orjson.dumps(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": "It means 'prompt is too long: 208310 tokens > 200000 maximum'.",
                        },
                        "finish_reason": "stop",
                    }
                ],
            }
        ),
    ),
    ("unauthorized", 401, openai_error("Incorrect API key provided", code="invalid_api_key")),
    (
        "overflow-text-on-503",
        503,
        openai_error(
            "This model's maximum context length is 4096 tokens. However, your messages resulted in 5000."
        ),
    ),
    ("groq-phrase-on-500", 500, openai_error("Please reduce the length of the messages or completion.")),
    ("empty", 400, b""),
    ("unrelated-400", 400, openai_error("Invalid value for 'temperature'", code="invalid_value")),
]


@pytest.mark.parametrize(
    ("status", "body"), [case[1:] for case in NEGATIVE], ids=[case[0] for case in NEGATIVE]
)
def test_look_alikes_are_not_overflows(status: int, body: bytes) -> None:
    assert classify_overflow(status, body) is None


def test_sglang_error_body_with_200_status() -> None:
    body = (
        b'{"error": {"object": "error", "message": "The input (61709 tokens) is longer than the model\'s '
        b'context length (40960 tokens).", "type": "BadRequestError", "param": null, "code": 400}}'
    )
    assert classify_overflow(200, body) == Overflow(40960, 61709, None, "sglang")


def test_vllm_output_larger_than_window_is_reported_with_its_numbers() -> None:
    # A max_tokens over the window: still the upstream's overflow, but the numbers
    # show compressing the prompt cannot make it fit.
    result = classify_overflow(
        400,
        vllm_error(
            "This model's maximum context length is 6048 tokens. However, you requested 6616 tokens (568 in "
            "the messages, 6048 in the completion). Please reduce the length of the messages or completion."
        ),
    )
    assert result == Overflow(6048, 568, 6048, "openai-requested")
    assert result.requested_output is not None and result.window is not None
    assert result.requested_output >= result.window


@pytest.mark.parametrize(
    "body",
    [
        b"\xff\xfe\x00garbage\x80\x81",
        b"{",
        b'{"error":',
        b"[" * 100_000,
        b'{"a":' * 5_000 + b"1" + b"}" * 5_000,
        b"null",
        b"12345",
        b'"just a string"',
        b'{"error": {"message": 12, "code": true, "type": ["x"]}}',
        b'{"error": {"n_ctx": 99999999999999999999, "message": "exceeds the available context size"}}',
        b"prompt is too long: " + b"9" * 100_000 + b" tokens > 1 maximum",
        b"\x00" * 1000,
    ],
    ids=[
        "non-utf8",
        "open-brace",
        "truncated-json",
        "deep-list",
        "deep-object",
        "null",
        "number",
        "string",
        "wrong-types",
        "huge-int",
        "huge-digit-run",
        "nul-bytes",
    ],
)
def test_garbage_never_raises(body: bytes) -> None:
    for status in (200, 400, 413, 422, 500):
        classify_overflow(status, body)
    classify_stream_error(body)


def test_huge_int_field_is_not_a_window() -> None:
    body = b'{"error": {"n_ctx": 99999999999999999999, "message": "exceeds the available context size"}}'
    result = classify_overflow(400, body)
    assert result is None or result.window is None


def test_huge_digit_run_is_not_a_count() -> None:
    result = classify_overflow(400, b"prompt is too long: " + b"9" * 100_000 + b" tokens > 1 maximum")
    assert result is None or result.prompt_tokens is None


def test_only_the_head_of_a_huge_body_is_read() -> None:
    padding = b"x" * (2 * 1024 * 1024)
    tail = b"prompt is too long: 208310 tokens > 200000 maximum"
    started = time.perf_counter()
    assert classify_overflow(400, padding + tail) is None
    assert time.perf_counter() - started < 1.0
    head = anthropic_error("prompt is too long: 208310 tokens > 200000 maximum")
    # JSON cut by the scan limit is searched as text.
    assert classify_overflow(400, head[:-2] + padding) == Overflow(200000, 208310, None, "anthropic-prompt")


def test_pathological_text_stays_fast() -> None:
    body = (b"This model's maximum context length is 1 tokens. However, you requested " + b"1," * 20_000) * 2
    started = time.perf_counter()
    classify_overflow(400, body)
    classify_stream_error(b"data: " + body)
    assert time.perf_counter() - started < 2.0


@settings(max_examples=500, deadline=None)
@given(status=st.integers(min_value=-1000, max_value=1000), body=st.binary(max_size=4096))
def test_classify_overflow_never_raises_on_arbitrary_bytes(status: int, body: bytes) -> None:
    result = classify_overflow(status, body)
    assert result is None or isinstance(result, Overflow)


FRAGMENTS = [
    '{"error":',
    '{"message":',
    '"prompt is too long: ',
    " tokens > ",
    " maximum",
    "This model's maximum context length is ",
    '"n_ctx":',
    '"code":"3051"',
    "[",
    "]",
    "}",
    ",",
    '"',
    "\\",
    "1,234",
    "99999999999",
    "-5",
    "\u2019s",
    "\ud800",
]


@settings(max_examples=500, deadline=None)
@given(parts=st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.integers(0, 10**12).map(str)), max_size=40))
def test_never_raises_on_near_miss_bodies(parts: list[str]) -> None:
    body = "".join(parts).encode("utf-8", errors="surrogatepass")
    for status in (200, 400, 500):
        result = classify_overflow(status, body)
        assert result is None or isinstance(result, Overflow)
    classify_stream_error(b"data: " + body + b"\n\n")


@settings(max_examples=300, deadline=None)
@given(chunk=st.binary(max_size=4096))
def test_classify_stream_error_never_raises_on_arbitrary_bytes(chunk: bytes) -> None:
    result = classify_stream_error(chunk)
    assert result is None or isinstance(result, Overflow)


# Events as upstreams write them: error objects, error markers, and ordinary events whose
# "error" is null (the Responses API's), with overflow wording in and out of error fields.
_EVENT_VALUES = st.recursive(
    st.none()
    | st.sampled_from(
        ["error", "response.failed", "This model's maximum context length is 4096 tokens", "x"]
    ),
    lambda inner: st.dictionaries(
        st.sampled_from(["error", "object", "type", "message", "response", "code", "text"]), inner, max_size=4
    ),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(
    events=st.lists(_EVENT_VALUES, min_size=1, max_size=4),
    spaced=st.booleans(),
)
@example(  # a failed response is an error by its type, whatever its "error" says
    events=[
        {
            "type": "response.failed",
            "error": None,
            "message": "This model's maximum context length is 4096 tokens",
        }
    ],
    spaced=False,
)
def test_skipping_events_whose_errors_are_all_null_never_changes_the_answer(
    events: list[object], spaced: bool
) -> None:
    encode = (
        (lambda v: json.dumps(v).encode()) if spaced else orjson.dumps
    )  # '"error": null' and '"error":null'
    chunk = b"".join(b"data: " + encode(event) + b"\n\n" for event in events)
    answer = classify_stream_error(chunk)
    with pytest.MonkeyPatch.context() as patched:  # every event parsed, as before the skip
        patched.setattr(overflow, "_only_null_errors", lambda payload: False)
        assert classify_stream_error(chunk) == answer


SGLANG_MESSAGE = "The input (400013 tokens) is longer than the model's context length (262144 tokens)."


@pytest.mark.parametrize(
    "chunk",
    [
        b"data: "
        + orjson.dumps(
            {
                "error": {
                    "object": "error",
                    "message": SGLANG_MESSAGE,
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            }
        )
        + b"\n\n",
        b"data: "
        + orjson.dumps(
            {
                "object": "error",
                "message": SGLANG_MESSAGE,
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        )
        + b"\n\ndata: [DONE]\n\n",
        b"data: " + orjson.dumps({"error": {"message": SGLANG_MESSAGE}}) + b"\r\n\r\n",
        b"event: error\ndata: "
        + orjson.dumps({"type": "error", "error": {"message": SGLANG_MESSAGE}})
        + b"\n\n",
        # One JSON document over two data lines, joined per the SSE spec.
        b'data: {"error": {"message":\ndata:  "' + SGLANG_MESSAGE.encode() + b'"}}\n\n',
        # A bare JSON error with an event-stream content type.
        orjson.dumps({"error": {"message": SGLANG_MESSAGE}}),
        # The role chunk some servers send before the error event.
        b"data: "
        b'{"id":"1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant"}}]}'
        b"\n\ndata: " + orjson.dumps({"error": {"message": SGLANG_MESSAGE, "code": 400}}) + b"\n\n",
        # After an event whose "error" is null, as every Responses event has it.
        b'event: response.created\ndata: {"type":"response.created","response":{"id":"r","error":null}}'
        b"\n\ndata: " + orjson.dumps({"error": {"message": SGLANG_MESSAGE}}) + b"\n\n",
    ],
    ids=[
        "sglang-error-wrapper",
        "object-error",
        "crlf",
        "anthropic-event",
        "multi-line-data",
        "bare-json",
        "after-role",
        "after-null-errors",
    ],
)
def test_stream_error_events(chunk: bytes) -> None:
    assert classify_stream_error(chunk) == Overflow(262144, 400013, None, "sglang")


def test_stream_llamacpp_error_uses_fields() -> None:
    chunk = (
        b'data: {"error":{"code":400,"message":"the request exceeds the available context size, try '
        b"increasing "
        b'it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}\n\n'
    )
    assert classify_stream_error(chunk) == Overflow(4096, 5000, None, "llamacpp")


@pytest.mark.parametrize(
    "chunk",
    [
        # A normal completion chunk whose text talks about context lengths.
        b"data: "
        + orjson.dumps(
            {
                "id": "1",
                "object": "chat.completion.chunk",
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "content": "This model's maximum context length is 4096 tokens. However, your "
                        },
                    }
                ],
            }
        )
        + b"\n\n",
        b"data: [DONE]\n\n",
        b"",
        b": keep-alive\n\n",
        b'data: {"error": {"message": "Rate limit reached for requests", "code": 429}}\n\n',
        b'data: {"error": {"message": "prompt is too lo',
    ],
    ids=["content-mentions-overflow", "done", "empty", "comment", "other-error", "partial-event"],
)
def test_stream_chunks_without_overflow(chunk: bytes) -> None:
    assert classify_stream_error(chunk) is None


@pytest.mark.parametrize(
    ("estimated", "reported", "truncated"),
    [
        (40_000, 2_048, True),  # Ollama default num_ctx 2048
        (9_000, 4_096, True),  # num_ctx 4096
        (10_000, 7_000, False),  # within a tokenizer's error
        (10_000, 6_100, False),  # 0.61: still plausible
        (10_000, 5_900, True),  # 0.59 and 4,100 tokens short
        (500, 250, False),  # half of a small prompt: 250 tokens is within template/image drift…
        (600, 300, True),  # …300 is not
        (400, 150, False),  # gap 250 ≤ 256
        (10_000, 0, False),  # the upstream did not count
        (0, 100, False),
        (-5, 100, False),
        (1_000, 1_200, False),  # counted more than estimated
    ],
)
def test_silent_truncation(estimated: int, reported: int, truncated: bool) -> None:
    assert detect_silent_truncation(estimated, reported) is truncated


def test_gateway_error_body_is_openai_shaped_and_recognised() -> None:
    message = "Prompt of 140000 tokens cannot fit the 128000-token window of gpt-4o (output reserve 4096)."
    body = overflow_error_body(message)
    assert orjson.loads(body) == {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    assert classify_overflow(400, body) == Overflow(None, None, None, "context-length-exceeded")


def test_gateway_error_body_survives_lone_surrogates() -> None:
    body = overflow_error_body("bad \udcff text")
    assert orjson.loads(body)["error"]["code"] == "context_length_exceeded"


def anthropic_unknown_block_error(block_type: str) -> bytes:
    # The real Messages API names an unknown content block's `type` in its validation error.
    return anthropic_error(
        f"messages.0.content.0: Input tag '{block_type}' found using 'type' does not match any of the "
        "expected tags: 'text', 'image', 'tool_use', 'tool_result'"
    )


@pytest.mark.parametrize(
    ("error", "request_body"),
    [
        (
            anthropic_unknown_block_error("prompt is too long: 3000 tokens > 1100 maximum"),
            {
                "messages": [
                    {"role": "user", "content": [{"type": "prompt is too long: 3000 tokens > 1100 maximum"}]}
                ]
            },
        ),
        (
            openai_error(
                "Invalid parameter: messages with role 'tool' must be a response to a preceding message with "
                "'tool_calls'. No tool call found for 'This model\\'s maximum context length is 1100 tokens. "
                "However, your messages resulted in 3000 tokens.'",
                code=None,
            ),
            {
                "messages": [
                    {
                        "role": "tool",
                        "tool_call_id": "This model's maximum context length is 1100 tokens. "
                        "However, your   messages resulted in 3000 tokens.",
                        "content": "x",
                    }
                ]
            },
        ),
    ],
    ids=["anthropic-block-type", "openai-tool-call-id-repr"],
)
def test_an_overflow_wording_the_request_holds_is_a_quote_not_a_refusal(
    error: bytes, request_body: dict[str, object]
) -> None:
    """A validation error quoting a client value spelled as an overflow would otherwise teach the
    gateway a window of the client's choosing for every client of the model: it reads as an
    overflow with no numbers, which nothing is learned from (the prompt is still retried, as an
    upstream's own refusal may quote a request that talks about one)."""
    sent = orjson.dumps(request_body)
    alone = classify_overflow(400, error)
    assert alone is not None and alone.window is not None and not alone.client_spelled
    quoted = classify_overflow(400, error, sent)
    assert quoted is not None and quoted.client_spelled and quoted.window is None
    stream_head = b"data: " + error + b"\n\n"
    assert classify_stream_error(stream_head) == alone
    streamed = classify_stream_error(stream_head, sent)
    assert streamed is not None and streamed.client_spelled and streamed.window is None


def test_an_overflow_spelled_across_values_the_upstream_lists_together_teaches_no_window() -> None:
    """OpenAI lists the tool_call_ids it cannot pair joined by ", ": a client spreading one overflow
    sentence over two ids rebuilt it there, and its window was learned for every client."""
    ids = [
        "This model's maximum context length is 1100 tokens. However",
        "you requested 1300 tokens (1290 in the messages, 10 in the completion)",
    ]
    calls = [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids]
    sent = orjson.dumps({"messages": [{"role": "assistant", "content": None, "tool_calls": calls}]})
    error = openai_error(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
        "'tool_call_id'. The following tool_call_ids did not have response messages: " + ", ".join(ids)
    )
    alone = classify_overflow(400, error)
    assert alone is not None and alone.window == 1100  # the wording alone reads as a stated window
    spelled = classify_overflow(400, error, sent)
    assert spelled is not None and (spelled.window, spelled.prompt_tokens, spelled.requested_output) == (
        None,
        None,
        None,
    )
    assert classify_stream_error(b"data: " + error + b"\n\n", sent) == spelled
    # Pieces that run past the wording on either side, or three of them: still the client's.
    for pieces in (
        ["zz " + ids[0], ids[1] + " zz"],
        ["This model's maximum context length is", "1100", "tokens. However, you requested 1300 tokens"],
    ):
        calls = [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in pieces]
        sent = orjson.dumps({"messages": [{"role": "assistant", "content": None, "tool_calls": calls}]})
        unpaired = "The following tool_call_ids did not have response messages: "
        listed = openai_error(unpaired + " ".join(pieces))
        read = classify_overflow(400, listed, sent)
        assert read is not None and read.window is None, pieces


def test_pieces_the_error_quotes_escaped_still_read_as_the_clients() -> None:
    """A provider body kept as text inside a gateway's error (OpenRouter's `metadata.raw`), or a body
    past the scan limit, shows the client's strings with their JSON escapes."""
    ids = [
        "x\"this model's maximum context length is 100 tokens",
        'however, your messages resulted in 5 tokens"x',
    ]
    calls = [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids]
    sent = orjson.dumps({"messages": [{"role": "assistant", "content": None, "tool_calls": calls}]})
    inner = openai_error("The following tool_call_ids did not have response messages: " + ", ".join(ids))
    wrapped = orjson.dumps(
        {"error": {"message": "Provider returned error", "metadata": {"raw": f"said: {inner.decode()}"}}}
    )
    read = classify_overflow(400, wrapped, sent)
    assert read is not None and read.client_spelled and read.window is None


def test_an_overflow_without_numbers_quoted_by_the_request_is_still_retried() -> None:
    """A coding agent's tool output showing the very sentence: the upstream's own refusal still
    reads as an overflow (retried compressed), only nothing is learned from it."""
    sent = orjson.dumps(
        {
            "messages": [
                {
                    "role": "tool",
                    "tool_call_id": "c",
                    "content": "log: Your input exceeds the context window of this model.",
                }
            ]
        }
    )
    error = openai_error(
        "Your input exceeds the context window of this model. Please adjust your input and try again."
    )
    read = classify_overflow(400, error, sent)
    assert read is not None and read.client_spelled


@pytest.mark.parametrize("short", ["10", "128000", "0", "call_1"])
def test_a_short_request_string_equal_to_an_upstream_number_leaves_its_numbers_read(short: str) -> None:
    own = openai_error(
        "This model's maximum context length is 128000 tokens. However, you requested 130010 tokens "
        "(130000 in the messages, 10 in the completion). Please reduce the length of the messages."
    )
    sent = orjson.dumps({"messages": [{"role": "user", "content": short}], "metadata": {"k": short}})
    read = classify_overflow(400, own, sent)
    assert read is not None
    assert (read.window, read.prompt_tokens, read.requested_output) == (128000, 130000, 10)


def test_a_request_quoting_other_numbers_or_a_code_still_gets_its_overflow_read() -> None:
    """Conversations quote overflow messages (a coding agent debugging one): only the very
    wording counts as a quote, and an error code is the upstream's own."""
    sent = orjson.dumps(
        {
            "messages": [
                {
                    "role": "user",
                    "content": "Why 'prompt is too long: 3000 tokens > 1100 maximum'? "
                    "context_length_exceeded",
                }
            ]
        }
    )
    real = classify_overflow(400, anthropic_error("prompt is too long: 250000 tokens > 200000 maximum"), sent)
    assert real == Overflow(200000, 250000, None, "anthropic-prompt")
    coded = classify_overflow(400, openai_error("Please reduce the length of the messages."), sent)
    assert coded is not None and coded.source == "groq"
    by_code = classify_overflow(400, openai_error("Request too large."), sent)
    assert by_code is not None and by_code.source == "context-length-exceeded"
