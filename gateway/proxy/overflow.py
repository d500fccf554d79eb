"""Recognise "context length exceeded" answers from any upstream behind an OpenAI base URL.

Pure: no I/O, no logging, never raises on what an upstream sends. The gateway
calls it on every non-2xx chat answer (and on the first events of a stream) to
decide whether to learn the model's real window, compress harder and retry.

Every wording lives in one ordered table, `_RULES`, each rule with the place
its wording was seen. The first rule that matches decides: exclusions first,
then wordings that state numbers, then wordings without numbers, then generic
fallbacks. Where several upstreams share a wording (OpenAI, Azure, DeepSeek and
old vLLM all say "This model's maximum context length is …") one rule serves
them all and its `evidence` names each.

JSON strings under keys that echo the request ("input", "messages", …) are
skipped: validation errors (FastAPI 422, pydantic) send the request back, and a
conversation that quotes an overflow message must not read as an overflow.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import orjson

__all__ = [
    "Overflow",
    "classify_overflow",
    "classify_stream_error",
    "detect_silent_truncation",
    "overflow_error_body",
]


@dataclass(frozen=True, slots=True)
class Overflow:
    """What an upstream said when it refused a prompt for its length.

    `window` is the maximum the message states. For most upstreams that bounds
    prompt + output; where it bounds the prompt alone (Gemini's input limit,
    Azure/OpenAI's "configured limit" for input, xAI's "maximum prompt
    length") `input_limit` is True, so a budget computed from it need not
    reserve room for the output. `prompt_tokens` is the upstream's own count
    of the prompt (a lower bound for vLLM's "at least N"), `requested_output`
    the output reservation it counted. A requested_output at or above the
    window means the request cannot fit whatever the prompt: compressing will
    not help, only a smaller max_tokens will.
    """

    window: int | None
    prompt_tokens: int | None
    requested_output: int | None
    source: str
    input_limit: bool = False
    # The words that matched, as read (lower case, whitespace collapsed); "" for a code field.
    wording: str = field(default="", compare=False)
    # The request's own strings wrote it, or most of it (`classify_overflow`): the prompt is
    # compressed and sent again, but nothing is learned about the model's window from it.
    client_spelled: bool = field(default=False, compare=False)


# A request string shorter than this is no piece of a spelled overflow (`_client_spelled`).
_MIN_PIECE_CHARS = 4
# Bodies can be megabytes (an HTML error page, a proxy echoing the request);
# every known overflow message sits in the first few hundred bytes.
_SCAN_LIMIT = 64 * 1024
# Bounds on the walk through a JSON body: nodes visited, and how many levels of
# JSON-inside-a-string it opens (OpenRouter's metadata.raw, Gemini CLI-style
# wrappers put a provider's whole error body in one string).
_MAX_NODES = 4096
_MAX_EMBEDDED_JSON = 3
# How many SSE events of a stream's head are inspected for an error event.
_MAX_STREAM_EVENTS = 8
# Within one line: what holds for a stream head's lines then holds for every event joined from them.
_NULL_ERROR = re.compile(rb'"error"[ \t]*:[ \t]*null')
# Larger numbers are garbage, not token counts (no model has a billion-token window).
_MAX_TOKENS = 1_000_000_000

# Keys whose scalar value is a machine code rather than prose; they are searched
# as "key=value" lines so a rule can anchor on a code ("code=3051") without
# matching the same digits inside a message.
_CODE_KEYS = frozenset({"code", "type", "error_type", "status"})
# Keys under which validation errors echo the caller's request: never searched.
_ECHO_KEYS = frozenset({"input", "messages", "content", "prompt", "request", "body"})
_CODE_PREFIXES = tuple(f"{key}=" for key in sorted(_CODE_KEYS))

# Statuses per rule. Wordings that can only mean a context overflow (most state
# numbers) are trusted on every status servers send them with: 400 (most), 413
# (Ollama embed, some gateways), 422 (TGI / Together validation), 500 (llama.cpp
# before ggml-org/llama.cpp#16486, Ollama runners, wrappers such as LiteLLM or
# Continue that fail to map the error). llama.cpp's and Ollama's unnumbered
# sentences: the 400 and 500 they come with. Phrases another error could share,
# and bare codes: 400 only. 429 is never an overflow (rate limits say "tokens"
# and "Requested" too) and 502/503/504 are availability errors: in no set.
_ANY_ERROR = frozenset({400, 413, 422, 500})
_BAD_REQUEST_OR_500 = frozenset({400, 500})
_BAD_REQUEST = frozenset({400})
_ALL_STATUSES = _ANY_ERROR | _BAD_REQUEST_OR_500 | _BAD_REQUEST

# Placeholders used in the rule patterns below. Numbers may carry thousands
# separators ("5,958,968"), only in groups of three so "Limit 6000, Requested"
# never reads as one number, and never start inside a longer number. <S> is the
# "'s" of "model's", also written with a curly quote, escaped (Python reprs
# inside LiteLLM messages: model\'s) or left out.
_NUMBER = r"(?<!\d)(?:\d{1,3}(?:,\d{3})+|\d+)"
_NUMBER_IN = re.compile(_NUMBER)
_PLACEHOLDERS = {
    "<W>": rf"(?P<window>{_NUMBER})",
    "<P>": rf"(?P<prompt>{_NUMBER})",
    "<O>": rf"(?P<output>{_NUMBER})",
    "<T>": rf"(?P<total>{_NUMBER})",
    "<N>": _NUMBER,
    "<S>": r"(?:\\?['’]s)?",
}
_ROLES = ("window", "prompt", "output", "total")


@dataclass(frozen=True, slots=True)
class _Rule:
    source: str
    pattern: re.Pattern[str]
    statuses: frozenset[int]
    evidence: str
    # Structured numbers, for upstreams that state them as JSON fields instead
    # of in the message: (json key, role).
    fields: tuple[tuple[str, str], ...] = ()
    input_limit: bool = False
    # An exclusion: a look-alike that must never read as an overflow even when
    # a later rule would match it.
    exclude: bool = False


def _rule(
    source: str,
    pattern: str,
    statuses: frozenset[int],
    evidence: str,
    *,
    fields: tuple[tuple[str, str], ...] = (),
    input_limit: bool = False,
    exclude: bool = False,
) -> _Rule:
    for placeholder, regex in _PLACEHOLDERS.items():
        pattern = pattern.replace(placeholder, regex)
    return _Rule(
        source=source,
        # Patterns are written in lower case and run on a lower-cased haystack:
        # case-sensitive matching keeps re's fast literal-prefix search.
        pattern=re.compile(pattern, re.MULTILINE),
        statuses=statuses,
        evidence=evidence,
        fields=fields,
        input_limit=input_limit,
        exclude=exclude,
    )


_LLAMACPP_FIELDS = (("n_prompt_tokens", "prompt"), ("n_ctx", "window"))

_RULES: tuple[_Rule, ...] = (
    # --- look-alikes ---------------------------------------------------------
    # litellm counts this as a context-window error; it is a per-string length
    # check (10 MiB), and LiteLLM can relay it as ContextWindowExceededError.
    _rule(
        "openai-string-too-long",
        r"string too long\. expected a string with maximum length|^code=string_above_max_length$",
        _ANY_ERROR,
        "OpenAI: Invalid 'messages[1].content': string too long. Expected a string with maximum "
        "length 10485760 … code string_above_max_length; litellm exception_mapping_utils lists it",
        exclude=True,
    ),
    # --- Anthropic (native and OpenAI-compatible endpoint) -------------------
    _rule(
        "anthropic-prompt",
        r"prompt is too long: <P> tokens > <W> maximum",
        _ANY_ERROR,
        "https://github.com/anthropics/claude-code/issues/12186 (400); "
        "https://github.com/continuedev/continue/issues/5896 (relayed as 500)",
    ),
    _rule(
        "anthropic-max-tokens",
        r"input length and `?max_tokens`? exceed context limit: <P> \+ <O> > <W>",
        _ANY_ERROR,
        "https://github.com/docker/docker-agent/issues/569; without backticks: "
        "https://github.com/stackblitz/bolt.new/issues/7414",
    ),
    # --- OpenAI wording, shared by Azure, DeepSeek, vLLM, OpenRouter ---------
    # vLLM >= 0.8 (must precede openai-requested, which would take "you requested N").
    _rule(
        "vllm-output",
        r"this model<S> maximum context length is <W> tokens\.? however,? you requested <O> output tokens"
        r" and your prompt contains(?: at least <P> input tokens)?",
        _ANY_ERROR,
        "vLLM serving engine: '… you requested 1024 output tokens and your prompt contains at least "
        "130049 input tokens, for a total of at least 131073 tokens'; earendil-works/pi "
        "packages/ai/src/utils/overflow.ts",
    ),
    _rule(
        "openai-messages",
        r"this model<S> maximum context length is <W> tokens[.,]? however,? your messages resulted in"
        r" (?:over )?<P> tokens",
        _ANY_ERROR,
        "OpenAI/Azure chat: https://github.com/mckaywrigley/repo-chat/issues/15; with functions: "
        "https://github.com/bytedance/deer-flow/issues/310; text-generation-webui ('This model maximum "
        "…, resulted in over N'): https://github.com/oobabooga/textgen/issues/4453",
    ),
    _rule(
        "openai-requested",
        r"this model<S> maximum context length is <W> tokens[.,]? however,? you requested <T> tokens"
        r"(?: \([^()\n]{0,160}?<O> (?:in|for) the completion\))?",
        _ANY_ERROR,
        "OpenAI: https://github.com/mckaywrigley/chatbot-ui/issues/102; legacy completions '(N in your "
        "prompt; M for the completion)': https://github.com/hwchase17/chat-your-data/issues/10; DeepSeek "
        "(code invalid_request_error): https://github.com/FoundationAgents/OpenManus/issues/62; vLLM < 0.8 "
        "(object error, BadRequestError): https://github.com/meta-llama/llama-verifications/issues/58",
    ),
    _rule(
        "openrouter",
        r"this endpoint<S> maximum context length is <W> tokens\.? however,? you requested about <T> tokens"
        r"(?: \((?:[^()\n]{0,160}?<O> in the output|<P> of text input)\))?",
        _ANY_ERROR,
        "https://github.com/refly-ai/refly/issues/1177 (litellm's string checks miss 'This endpoint's')",
    ),
    _rule(
        "openai-input-limit",
        r"input tokens exceed the configured limit of <W> tokens\.?"
        r"(?: your messages resulted in <P> tokens)?",
        _ANY_ERROR,
        "Azure OpenAI / GPT-5 family: https://github.com/BerriAI/litellm/issues/15968",
        input_limit=True,
    ),
    _rule(
        "openai-context-window",
        r"your input exceeds the context window of this model",
        _ANY_ERROR,
        "OpenAI Responses API and newer chat models (code context_length_exceeded, param input): "
        "https://github.com/anomalyco/opencode/issues/6071 — missed by litellm's string checks",
    ),
    # --- vLLM ---------------------------------------------------------------
    _rule(
        "vllm-prompt-too-long",
        r"the prompt \(total length <P>\) is too long to fit into the model \(context length <W>\)",
        _ANY_ERROR,
        "https://github.com/vllm-project/vllm/issues/12165",
    ),
    _rule(
        "vllm-decoder",
        r"\(length <P>\) is longer than the maximum model length of <W>",
        _ANY_ERROR,
        "vLLM input processor: 'The decoder prompt (length 12324) is longer than the maximum model length "
        "of 8192.' (token-id and multimodal prompts)",
    ),
    _rule(
        "vllm-decoder",
        r"is longer than the maximum model length of <W>",
        _ANY_ERROR,
        "vLLM input processor, as some clients relay it: 'input is longer than the maximum model length "
        "of 32768'",
    ),
    _rule(
        "vllm-legacy",
        r"input prompt \(<P> tokens\) is too long and exceeds limit of <W>",
        _ANY_ERROR,
        "vLLM 0.1.x: https://github.com/vllm-project/vllm/issues/687",
    ),
    # --- SGLang (also Together's newer engine) -------------------------------
    _rule(
        "sglang",
        r"the input \(<P> tokens\) is longer than the model<S> context length \(<W> tokens\)",
        _ANY_ERROR,
        "https://github.com/QwenLM/Qwen3/issues/1321; in-stream with HTTP 200: "
        "https://github.com/sgl-project/sglang/issues/12081; missed by litellm: "
        "https://github.com/BerriAI/litellm/issues/10793",
    ),
    _rule(
        "sglang-input-length",
        r"input length \(<P> tokens\) exceeds the maximum allowed length \(<W> tokens\)",
        _ANY_ERROR,
        "https://github.com/sgl-project/sglang/issues/4048",
    ),
    # --- llama.cpp server and its forks --------------------------------------
    _rule(
        "llamacpp",
        r"request \(<P> tokens\) exceeds the available context size \(<W> tokens\)",
        _ANY_ERROR,
        "https://github.com/llmmllab/llmmllab-api/issues/69 (type exceed_context_size_error)",
    ),
    _rule(
        "llamacpp",
        r"exceeds the available context size|^type=exceed_context_size_error$",
        _BAD_REQUEST_OR_500,
        "code 500 at introduction: https://github.com/ggml-org/llama.cpp/pull/15780; 400 with "
        "n_prompt_tokens/n_ctx: https://github.com/oobabooga/textgen/issues/7257",
        fields=_LLAMACPP_FIELDS,
    ),
    _rule(
        "ds4",
        r"prompt tokens \(<P>\) exceeds context size \(<W>\)|^type=context_exceeded$",
        _ANY_ERROR,
        "https://github.com/antirez/ds4/pull/150",
        fields=_LLAMACPP_FIELDS,
    ),
    _rule(
        "ds4",
        r"prompt has <P> tokens, but the configured context size is <W> tokens",
        _ANY_ERROR,
        "earendil-works/pi packages/ai/src/utils/overflow.ts test table",
    ),
    # --- Ollama ---------------------------------------------------------------
    _rule(
        "ollama-prompt",
        r"prompt too long; exceeded (?:max )?context length by <N> tokens",
        _ANY_ERROR,
        "Ollama with truncate=false: earendil-works/pi packages/ai/src/utils/overflow.ts",
    ),
    _rule(
        "ollama-input",
        r"input(?: length)? exceeds (?:the )?(?:maximum |max )?context length\b"
        r"(?: (?:of |\((?:n_ctx: )?)<W>)?",
        _BAD_REQUEST_OR_500,
        "ollama runner/ollamarunner/runner.go errorInputTooLong 'the input length exceeds the context "
        "length' (400, 500 in older runners); embed: 'input length exceeds maximum context length'",
    ),
    # --- Google Gemini (OpenAI-compatible endpoint) ---------------------------
    _rule(
        "gemini",
        r"the input token count(?: \(<P>\))? exceeds the maximum number of tokens allowed(?: \(<W>\))?",
        _ANY_ERROR,
        "list-wrapped body: https://github.com/google-gemini/gemini-cli/issues/6678; without the count: "
        "https://github.com/BerriAI/litellm/issues/18282",
        input_limit=True,
    ),
    # --- Mistral ---------------------------------------------------------------
    _rule(
        "mistral",
        r"prompt contains <P> tokens(?: and <N> draft tokens)?,? (?:and is )?too large for model with <W>"
        r" maximum context length",
        _ANY_ERROR,
        "https://github.com/BerriAI/litellm/pull/21647; body {object: error, type "
        "invalid_request_invalid_args, code '3051'} from mistralai SDKError",
    ),
    _rule(
        "mistral",
        r"^code=3051$",
        _BAD_REQUEST,
        "Mistral's error code for a prompt over the context length",
    ),
    # --- TGI / Together ---------------------------------------------------------
    _rule(
        "together-tgi",
        r"`inputs` tokens \+ `max_new_tokens` must be <= <W>\. given: <P> `inputs` tokens and <O>"
        r" `max_new_tokens`",
        _ANY_ERROR,
        "Together (400): https://github.com/stanford-crfm/helm/pull/2079; TGI (422): "
        "https://github.com/bytedance/UI-TARS-desktop/issues/626",
    ),
    _rule(
        "tgi-inputs",
        r"`inputs` must have less than <W> tokens\. given: <P>",
        _ANY_ERROR,
        "TGI (422): https://github.com/meta-llama/llama/issues/1103; https://github.com/h2oai/h2ogpt/issues/373",
        input_limit=True,
    ),
    # --- other OpenAI-compatible hosts ------------------------------------------
    _rule(
        "xai",
        r"maximum prompt length is <W> but the request contains <P> tokens",
        _ANY_ERROR,
        "xAI: body {code: 'Client specified an invalid argument', error: '…'}; "
        "earendil-works/pi packages/ai/src/utils/overflow.ts",
        input_limit=True,
    ),
    _rule(
        "cerebras",
        r"current length is <T> while limit is <W>",
        _ANY_ERROR,
        "https://github.com/cline/cline/issues/5140",
    ),
    _rule(
        "kimi",
        r"exceeded model token limit: <W> \(requested: <T>\)",
        _ANY_ERROR,
        "Kimi For Coding: earendil-works/pi packages/ai/src/utils/overflow.ts",
    ),
    _rule(
        "copilot",
        r"prompt token count of <P> exceeds the limit of <W>",
        _ANY_ERROR,
        "GitHub Copilot API: earendil-works/pi packages/ai/src/utils/overflow.ts",
    ),
    _rule(
        "poolside",
        r"input length <P> exceeds the maximum allowed input length of <W> tokens",
        _ANY_ERROR,
        "OpenRouter/Poolside: earendil-works/pi packages/ai/src/utils/overflow.ts",
        input_limit=True,
    ),
    _rule(
        "openai-compatible",
        r"input length \(<P>(?: tokens)?\) exceeds (?:the )?model<S> maximum context length"
        r" \(<W>(?: tokens)?\)",
        _ANY_ERROR,
        "hosts behind OpenRouter/LiteLLM: 'Input length (265330) exceeds model's maximum context length "
        "(262144).' (earendil-works/pi packages/ai/src/utils/overflow.ts)",
    ),
    _rule(
        "openai-compatible",
        r"exceeds the model<S> maximum context length of <W> tokens",
        _ANY_ERROR,
        "'Requested token count exceeds the model's maximum context length of 131072 tokens.' "
        "(earendil-works/pi packages/ai/src/utils/overflow.ts)",
    ),
    _rule(
        "lmstudio",
        r"trying to keep the first <P> tokens when context the overflows\. however, the model is loaded"
        r" with context length of only <W> tokens",
        _ANY_ERROR,
        "LM Studio: body {error: 'Trying to keep the first 5210 tokens when context the overflows. However, "
        "the model is loaded with context length of only 4096 tokens, …'}",
    ),
    _rule(
        "lmstudio",
        r"the model is loaded with context length of only <W> tokens",
        _ANY_ERROR,
        "LM Studio, the same sentence without its first half",
    ),
    _rule(
        "lmstudio",
        r"input length <P> exceeds context length <W>"
        r"|tokens to keep from the initial prompt is greater than the context length",
        _ANY_ERROR,
        "https://github.com/lmstudio-ai/model-catalog/issues/38; 'tokens to keep from the initial prompt "
        "is greater than the context length'",
    ),
    _rule(
        "dashscope",
        r"range of input length should be \[1, <W>\]",
        _ANY_ERROR,
        "Alibaba DashScope (Qwen): earendil-works/pi packages/ai/src/utils/overflow.ts",
        input_limit=True,
    ),
    _rule(
        "minimax",
        r"context window exceeds limit",
        _BAD_REQUEST,
        "MiniMax: 'invalid params, context window exceeds limit' (earendil-works/pi overflow.ts)",
    ),
    # Any other sentence after OpenAI's opening still states the window.
    _rule(
        "openai-window",
        r"this (?:model|endpoint)<S> maximum context length is <W>",
        _ANY_ERROR,
        "any other sentence after OpenAI's opening, e.g. vLLM's '… your prompt contains 581 characters' "
        "or Bedrock's 'Please reduce the length of the prompt'",
    ),
    # --- a LiteLLM proxy upstream ------------------------------------------------
    # After the provider rules: LiteLLM keeps the provider's message inside its
    # own, so a numbered wording is found first and this only catches the rest.
    _rule(
        "litellm",
        r"contextwindowexceedederror",
        _ANY_ERROR,
        "{'error': {'message': 'litellm.BadRequestError: litellm.ContextWindowExceededError: …', 'type': "
        "None, 'param': None, 'code': '400'}}: https://github.com/BerriAI/litellm/issues/7259",
    ),
    # --- generic fallbacks, last ---------------------------------------------------
    _rule(
        "groq",
        r"please reduce the length of the messages",
        _BAD_REQUEST,
        "Groq (code context_length_exceeded, no numbers): https://github.com/OpenHands/OpenHands/issues/1902",
    ),
    _rule(
        "prompt-too-long",
        r"prompt (?:is )?too long\b",
        _BAD_REQUEST,
        "Zhipu {code: '1261', message: 'Prompt too long'}, Claude Code's 'Prompt is too long'",
    ),
    _rule(
        "context-length-exceeded",
        r"context[_ ]length[_ ]exceeded\b",
        _BAD_REQUEST,
        "OpenAI/Azure/Groq code context_length_exceeded; OpenRouter metadata.error_type",
    ),
)


@dataclass(slots=True)
class _Scan:
    lines: list[str] = field(default_factory=list)
    numbers: dict[str, int] = field(default_factory=dict)
    error_object: bool = False

    def haystack(self) -> str:
        # One line per JSON string, inner whitespace collapsed: a pattern never
        # spans two fields, and a message wrapped over lines still reads.
        return "\n".join(" ".join(line.split()) for line in self.lines).lower()


def _is_error_object(value: object) -> bool:
    """The shapes upstreams use for an error, at the top of a body or SSE event."""
    if isinstance(value, list):
        return bool(value) and _is_error_object(value[0])  # Gemini: [{"error": {...}}]
    if not isinstance(value, dict):
        return False
    # The Responses API ends a stream that failed with a `response.failed` event carrying the error.
    kind = value.get("type")
    return bool(value.get("error")) or value.get("object") == "error" or kind in ("error", "response.failed")


def _looks_like_json(text: str) -> bool:
    return text[:1] in ("{", "[")


def _walk(root: object, scan: _Scan) -> None:
    # Iterative, in document order, bounded: a hostile body cannot recurse or loop.
    stack: list[tuple[object, str | None, int]] = [(root, None, 0)]
    visited = 0
    while stack and visited < _MAX_NODES:
        value, key, embedded = stack.pop()
        visited += 1
        if key in _ECHO_KEYS:
            continue
        if isinstance(value, dict):
            children = [(v, k if isinstance(k, str) else None, embedded) for k, v in value.items()]
            stack.extend(reversed(children))
        elif isinstance(value, list):
            stack.extend(reversed([(v, key, embedded) for v in value]))
        elif isinstance(value, str):
            if key in _CODE_KEYS:
                scan.lines.append(f"{key}={value}")
                continue
            if embedded < _MAX_EMBEDDED_JSON and _looks_like_json(value):
                try:
                    stack.append((orjson.loads(value), None, embedded + 1))
                    continue
                except orjson.JSONDecodeError:
                    pass
            scan.lines.append(value)
        elif isinstance(value, int) and not isinstance(value, bool) and key is not None:
            if key in _CODE_KEYS:
                scan.lines.append(f"{key}={value}")
            scan.numbers.setdefault(key, value)


def _scan(payload: bytes, *, errors_only: bool = False) -> _Scan:
    """The payload's text lines and numbers; with `errors_only`, the lines only when it is shaped
    as an error (a stream's ordinary events, which may name a null "error", are not walked)."""
    head = payload[:_SCAN_LIMIT]
    scan = _Scan()
    try:
        document: object = orjson.loads(head)
    except orjson.JSONDecodeError:
        # Plain text, HTML, or JSON cut by the scan limit: search the text as is.
        scan.lines.append(head.decode("utf-8", errors="replace"))
        return scan
    scan.error_object = _is_error_object(document)
    if scan.error_object or not errors_only:
        _walk(document, scan)
    return scan


def _bounded(value: int | None) -> int | None:
    return value if value is not None and 0 <= value <= _MAX_TOKENS else None


def _number(text: str | None) -> int | None:
    if text is None:
        return None
    digits = text.replace(",", "")
    # Checked before int(): a run of thousands of digits would make int() raise.
    return _bounded(int(digits)) if len(digits) <= 10 else None


def _match(scan: _Scan, status: int | None) -> Overflow | None:
    """First rule that matches decides; `status` None means any (an in-band error)."""
    haystack = scan.haystack()
    for rule in _RULES:
        if not rule.exclude and status is not None and status not in rule.statuses:
            continue
        found = rule.pattern.search(haystack)
        if found is None:
            continue
        if rule.exclude:
            return None
        groups = found.groupdict()
        values = {role: _number(groups.get(role)) for role in _ROLES}
        for key, role in rule.fields:
            if values[role] is None and key in scan.numbers:
                values[role] = _bounded(scan.numbers[key])
        prompt, total, output = values["prompt"], values["total"], values["output"]
        # "you requested T tokens (… C in the completion)": the prompt is what is
        # left once the output reservation is taken off (messages + functions).
        if prompt is None and total is not None and output is not None and total >= output:
            prompt = total - output
        window = values["window"]
        return Overflow(
            window=window if window else None,
            prompt_tokens=prompt,
            requested_output=output,
            source=rule.source,
            input_limit=rule.input_limit,
            wording="" if _code_line(haystack, found.start()) else found.group(0),
        )
    return None


def _code_line(haystack: str, position: int) -> bool:
    """Is the haystack's line at `position` a "key=value" line of a code field?"""
    start = haystack.rfind("\n", 0, position) + 1
    return haystack.startswith(_CODE_PREFIXES, start)


def _normalized(text: str) -> str:
    # As the haystack reads, less backslashes: an upstream may quote a value as a repr (model\'s).
    return " ".join(text.replace("\\", "").split()).lower()


def _client_spelled(overflow: Overflow, sent: bytes) -> bool:
    """Did the request itself write the wording? One of its strings holds all of it; or its strings
    cover three quarters of it; or one of them holds a number the overflow states together with
    words around it (pieces of one sentence, spread over values the upstream lists together, as
    OpenAI lists the tool_call_ids it cannot pair).

    Validation errors quote client values (Anthropic names an unknown content block's `type`,
    OpenAI a `tool_call_id` it cannot pair), so a client could spell an overflow, with a window
    of its choosing, into an error about something else: believed, that window would be learned
    for every client of the model. Compared as read (`_normalized`: case, whitespace and the
    backslashes of an escape do not count), so an error that quotes a value escaped says the
    same. A few words of the wording in a request (a tool schema's `maximum`, a user quoting
    "prompt is too long") cover too little, and a string that only equals a number ("10", a
    reply) holds no words around it. Each distinct string is read once.
    """
    wording = _normalized(overflow.wording)
    if not sent or not wording:
        return False
    try:
        stack: list[object] = [orjson.loads(sent)]
    except orjson.JSONDecodeError:
        return wording in _normalized(sent.decode("utf-8", errors="replace"))
    stated = {n for n in (overflow.window, overflow.prompt_tokens, overflow.requested_output) if n}
    numbers = [found.span() for found in _NUMBER_IN.finditer(wording) if _number(found.group()) in stated]
    covered = bytearray(len(wording))
    seen: set[str] = set()
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str) and len(value) >= _MIN_PIECE_CHARS and value not in seen:
            seen.add(value)
            piece = _normalized(value)
            if wording in piece:
                return True
            for first, last in _overlaps(piece, wording):
                covered[first:last] = b"\x01" * (last - first)
                if any(first <= a and b <= last and last - first > b - a for a, b in numbers):
                    return True
    return 4 * sum(covered) >= 3 * len(wording)


def _overlaps(piece: str, wording: str) -> Iterator[tuple[int, int]]:
    """Where `piece` overlaps `wording`, as (start, end) in the wording: each occurrence inside it,
    and a piece that runs past its start or its end by at least `_MIN_PIECE_CHARS` inside it."""
    if len(piece) < _MIN_PIECE_CHARS:
        return
    at = wording.find(piece)
    while at >= 0:
        yield at, at + len(piece)
        at = wording.find(piece, at + 1)
    head, tail = wording[:_MIN_PIECE_CHARS], wording[-_MIN_PIECE_CHARS:]
    # The piece ends inside the wording: a suffix of it is the wording's start.
    at = piece.find(head, max(1, len(piece) - len(wording) + 1))
    while at >= 0:
        if wording.startswith(piece[at:]):
            yield 0, len(piece) - at
        at = piece.find(head, at + 1)
    # The piece starts inside the wording: a prefix of it is the wording's end.
    at = piece.find(tail, 0, len(wording) - 1)
    while at >= 0:
        if wording.endswith(piece[: at + _MIN_PIECE_CHARS]) and at + _MIN_PIECE_CHARS < len(piece):
            yield len(wording) - at - _MIN_PIECE_CHARS, len(wording)
        at = piece.find(tail, at + 1, len(wording) - 1)


def _believed(overflow: Overflow, sent: bytes) -> Overflow:
    """The overflow as far as the client did not write it: when it did, still an overflow (the
    prompt is compressed and sent again; an upstream's own refusal may well quote a request that
    talks about one), but without numbers and never learned from."""
    if _client_spelled(overflow, sent):
        return replace(overflow, window=None, prompt_tokens=None, requested_output=None, client_spelled=True)
    return overflow


def classify_overflow(status: int, body: bytes, sent: bytes = b"") -> Overflow | None:
    """Is this upstream answer a refusal for context length? With the numbers it states.

    A 2xx counts only when its body is an error object (SGLang answers 200 with
    an error body); 429 never does. Only the first 64 KiB of the body is read.
    A wording that the request `sent` wrote itself is an overflow without numbers, never learned
    from (`_believed`).
    """
    is_success = 200 <= status < 300
    if not is_success and status not in _ALL_STATUSES:
        return None
    scan = _scan(body)
    if is_success and not scan.error_object:
        return None
    overflow = _match(scan, None if is_success else status)
    return None if overflow is None else _believed(overflow, sent)


def _sse_payloads(chunk: bytes) -> Iterator[bytes]:
    """The data of each SSE event, per the spec: data lines joined, events split on blank lines;
    as they come, so that reading the first few does not split the whole chunk."""
    data: list[bytes] = []
    saw_data = False
    start = 0
    while start <= len(chunk):
        end = chunk.find(b"\n", start)
        if end < 0:
            end = len(chunk)
        line = chunk[start:end].rstrip(b"\r")
        start = end + 1
        if not line:
            if data:
                yield b"\n".join(data)
                data = []
            continue
        if line.startswith(b"data:"):
            saw_data = True
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)
    if data:
        yield b"\n".join(data)
    elif not saw_data:
        yield chunk  # some servers answer a streamed request with a bare JSON error body


def _only_null_errors(payload: bytes) -> bool:
    """Whether every `"error"` in the event (or a whole stream head) is a key set to null, as in
    each ordinary event of the Responses API, which then cannot be shaped as an error: it is not
    parsed. (Those events echo the request's instructions and tools, so parsing them cost more
    than the rest of the head.) An error's own `"error"` is an object or a string value, and
    `response.failed` is matched by name, so no error event is skipped."""
    return (
        payload.count(b'"error"') == len(_NULL_ERROR.findall(payload)) and b"response.failed" not in payload
    )


def classify_stream_error(chunk: bytes, sent: bytes = b"") -> Overflow | None:
    """Find an overflow in the first SSE events of a stream that began with HTTP 200.

    SGLang (and vLLM, LiteLLM in some paths) send `data: {"error": {...}}` or
    `data: {"object": "error", ...}` after a 200. Only events shaped as errors are
    read, so a completion whose text talks about context lengths never matches.
    """
    head = chunk[:_SCAN_LIMIT]
    # Every error shape names "error"; most streams never do, and skip the parse entirely. A
    # Responses stream names it in every event, set to null: then no event can be an error, and
    # the head is not split into events either.
    if b"error" not in head or _only_null_errors(head):
        return None
    for payload in itertools.islice(_sse_payloads(head), _MAX_STREAM_EVENTS):
        if b"error" not in payload or payload.strip() == b"[DONE]" or _only_null_errors(payload):
            continue
        scan = _scan(payload, errors_only=True)
        if not scan.error_object:
            continue
        overflow = _match(scan, None)
        if overflow is not None:
            return _believed(overflow, sent)
    return None


# Silent truncation (Ollama's OpenAI endpoint cuts the prompt to num_ctx and
# answers 200). Our estimate uses an OpenAI tokenizer; for other tokenizers it
# can be off by about ±30%, so an honest count can fall to ~0.7x the estimate.
# Below 0.6x is beyond that error (with room for template overhead); the
# absolute gap keeps small prompts, where a chat template or an image's token
# accounting alone can differ by a few hundred tokens, from tripping it.
_TRUNCATION_RATIO_NUM = 3
_TRUNCATION_RATIO_DEN = 5
_TRUNCATION_MIN_GAP = 256


def detect_silent_truncation(estimated_prompt_tokens: int, reported_prompt_tokens: int) -> bool:
    """Did the upstream count far fewer prompt tokens than were sent (silently truncated)?

    True when reported < 0.6 x estimated and the gap exceeds 256 tokens. A
    reported count of 0 or less means the upstream did not count: never a
    truncation. Pass the full prompt count (cached tokens included).
    """
    if estimated_prompt_tokens <= 0 or reported_prompt_tokens <= 0:
        return False
    gap = estimated_prompt_tokens - reported_prompt_tokens
    scaled_reported = reported_prompt_tokens * _TRUNCATION_RATIO_DEN
    return scaled_reported < estimated_prompt_tokens * _TRUNCATION_RATIO_NUM and gap > _TRUNCATION_MIN_GAP


def overflow_error_body(message: str) -> bytes:
    """The gateway's own 400 body, shaped as OpenAI's so apps' existing handling applies."""
    error = {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    try:
        return orjson.dumps(error)
    except orjson.JSONEncodeError:
        # Lone surrogates (text decoded with surrogateescape) are not valid UTF-8.
        error["error"]["message"] = message.encode("utf-8", errors="replace").decode("utf-8")
        return orjson.dumps(error)
