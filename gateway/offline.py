"""Keep start-up and requests off the internet.

litellm fetches a remote model cost map at import unless told otherwise, and
tiktoken downloads its encodings on first use. Both ship local copies in the
litellm package; point at them before either library is touched. The litellm
package is located without importing it (its import costs seconds).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def litellm_package_dir() -> Path | None:
    spec = importlib.util.find_spec("litellm")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def configure_offline() -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return
    package_dir = litellm_package_dir()
    if package_dir is not None:
        tokenizers = package_dir / "litellm_core_utils" / "tokenizers"
        if tokenizers.is_dir():
            os.environ["TIKTOKEN_CACHE_DIR"] = str(tokenizers)
