"""Prompt token counting and context-window resolution.

- `counter.py`: `counter_for(model)` → `TokenCounter` (text/message/messages/
  tools/request, `byte_upper_bound`), `count_request_async`, the shared
  `CALIBRATION`;
- `formats.py`: how each message shape, tool definition and response schema
  turns into tokens; `images.py`, `media.py`: attachments;
- `encodings.py`: tokenizer and constants per model family, `warm_up()`;
- `cache.py`: per-message count cache; `calibration.py`: learned factors;
- `windows.py`: context-window resolution and the usable prompt budget;
  `model_names.py`: the model map under the names apps send; `learned_windows.py`:
  windows learned from overflow errors; `discovery.py`: windows the upstream states;
  `expiring.py`: the bounded, expiring per-model map they share.
"""

from gateway.tokens.calibration import Calibration
from gateway.tokens.counter import (
    CALIBRATION,
    TokenCounter,
    count_request_async,
    counter_for,
)
from gateway.tokens.encodings import warm_up
from gateway.tokens.learned_windows import LearnedWindows
from gateway.tokens.windows import (
    ModelMap,
    ResolvedWindow,
    WindowResolver,
    output_reserve,
    usable_budget,
)

__all__ = [
    "CALIBRATION",
    "Calibration",
    "LearnedWindows",
    "ModelMap",
    "ResolvedWindow",
    "TokenCounter",
    "WindowResolver",
    "count_request_async",
    "counter_for",
    "output_reserve",
    "usable_budget",
    "warm_up",
]
