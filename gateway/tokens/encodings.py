"""Which tokenizer, counting constants and image rule apply to a model name.

OpenAI models are counted with their own BPE (exact). Every other family is
counted with `o200k_base` and multiplied by a family factor (an approximation
that the calibration in `calibration.py` then corrects from the upstream's
reported usage).

Family factors (o200k_base count × factor ≈ the family's own count):

- Claude 1.20: Anthropic's tokenizer yields more tokens than o200k_base on
  English and code; 1.20 is a conservative choice (it over-estimates rather
  than under-estimates) until calibration has seen a few answers.
- gpt-oss 1.0: its tokenizer is o200k_base plus chat special tokens; it is
  still an approximation because third-party hosts frame the chat their own
  way (see `_GPT_OSS`).
- Everything else 1.10 (Llama 3, Qwen, Mistral, DeepSeek, Gemini, unknown):
  their vocabularies are 100k–260k entries like o200k_base, so counts are
  close on English; 1.10 is a conservative margin for the gap on code and
  non-English text, not a measured constant.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

import tiktoken

from gateway.tokens.images import AREA_CLAUDE, ImageRule, PatchRule, TileRule

O200K = "o200k_base"
CL100K = "cl100k_base"

CLAUDE_FACTOR = 1.20
DEFAULT_FACTOR = 1.10

# OpenAI cookbook "How to count tokens with tiktoken" (num_tokens_for_tools):
# gpt-4o / gpt-4o-mini open each function definition with 7 tokens,
# gpt-3.5-turbo / gpt-4 with 10. The other tool constants are shared.
FUNC_INIT_O200K = 7
FUNC_INIT_CL100K = 10

# OpenAI's vision guide: gpt-4o/4.1/4.5/4-turbo 85 + 170 per 512px tile,
# gpt-4o-mini 2833 + 5667, o1/o3 75 + 150, computer-use-preview 65 + 129;
# patch-billed models: 32px patches (cap 1536) × a per-model multiplier.
# gpt-5 is kept on 85/170: if its real figures are lower we over-estimate,
# which only costs compression headroom, never an overflow.
_TILE_4O = TileRule(base=85, tile=170)
_TILE_4O_MINI = TileRule(base=2833, tile=5667)
_TILE_O_SERIES = TileRule(base=75, tile=150)
_TILE_CUA = TileRule(base=65, tile=129)


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """Everything that decides how a model's prompt is counted.

    `key` names the counting rules (encoding + constants + image rule); two
    models with the same key count every message identically, so it is the
    namespace of the per-message count cache.
    """

    key: str
    encoding_name: str
    exact: bool
    factor: float
    func_init: int
    image: ImageRule


def _openai(key: str, image: ImageRule, encoding_name: str = O200K) -> ModelProfile:
    func_init = FUNC_INIT_O200K if encoding_name == O200K else FUNC_INIT_CL100K
    return ModelProfile(key, encoding_name, True, 1.0, func_init, image)


def _approx(key: str, factor: float, image: ImageRule) -> ModelProfile:
    return ModelProfile(key, O200K, False, factor, FUNC_INIT_O200K, image)


# First matching prefix wins, so longer/more specific prefixes come first.
_OPENAI_PREFIXES: tuple[tuple[tuple[str, ...], ModelProfile], ...] = (
    (("gpt-4o-mini",), _openai("o200k/4o-mini", _TILE_4O_MINI)),
    (("gpt-4.1-mini", "gpt-5-mini"), _openai("o200k/patch-1.62", PatchRule(1.62))),
    (("gpt-4.1-nano", "gpt-5-nano"), _openai("o200k/patch-2.46", PatchRule(2.46))),
    (("o4-mini",), _openai("o200k/patch-1.72", PatchRule(1.72))),
    (("computer-use-preview",), _openai("o200k/cua", _TILE_CUA)),
    (("o1", "o3"), _openai("o200k/o-series", _TILE_O_SERIES)),
    (
        ("gpt-4o", "chatgpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5"),
        _openai("o200k/4o", _TILE_4O),
    ),
    (("gpt-4", "gpt-3.5", "gpt-35"), _openai("cl100k", _TILE_4O, CL100K)),
)

# gpt-oss shares o200k's vocabulary, but it is served by third parties with
# their own chat template (a system preamble, harmony framing), so its
# per-request overhead is not OpenAI's: counted as an approximation and
# calibrated, with factor 1.0 because the text itself tokenizes identically.
_GPT_OSS = _approx("o200k/gpt-oss", 1.0, _TILE_4O)
_CLAUDE = _approx("o200k/claude", CLAUDE_FACTOR, AREA_CLAUDE)
_DEFAULT = _approx("o200k/default", DEFAULT_FACTOR, _TILE_4O)


def base_model_name(model: str) -> str:
    """The model name without provider prefixes or fine-tune markers.

    `openrouter/openai/gpt-4o` → `gpt-4o`; `ft:gpt-4o-mini:org::id` →
    `gpt-4o-mini:org::id`; `azure/my-deployment` → `my-deployment` (an Azure
    deployment name says nothing about the model: it falls to the default).
    """
    name = model.strip().lower().rsplit("/", 1)[-1]
    return name.removeprefix("ft:")


def _matches(name: str, prefix: str) -> bool:
    # `o1` must match `o1`, `o1-mini`, `o1-pro` but not `o100-foo`.
    return name == prefix or (name.startswith(prefix) and not name[len(prefix)].isalnum())


def profile_for(model: str) -> ModelProfile:
    name = base_model_name(model)
    for prefixes, profile in _OPENAI_PREFIXES:
        if any(_matches(name, prefix) for prefix in prefixes):
            return profile
    if name.startswith("gpt-oss"):
        return _GPT_OSS
    if "claude" in name:
        return _CLAUDE
    return _DEFAULT


@cache
def get_encoding(name: str) -> tiktoken.Encoding:
    return tiktoken.get_encoding(name)


def warm_up(encodings: Iterable[str] = (O200K, CL100K)) -> None:
    """Load encodings at start-up rather than on a first request.

    Measured by bench/count.py: o200k_base ~0.5 s and ~73 MB, cl100k_base
    ~0.2 s and ~32 MB; a deployment serving no gpt-4/gpt-3.5 model can pass
    `(O200K,)` and save the latter.
    """
    for name in encodings:
        get_encoding(name).encode_ordinary("warm up")
