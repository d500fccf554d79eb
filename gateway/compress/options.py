"""Every threshold of the compression pipeline, with its documented default."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CompressionOptions:
    """Thresholds of `fit`. All sizes are tokens of the model's tokenizer.

    tool_result_caps: stage 2 trims older tool results longer than a cap to
        about that size (head, tail and informative lines in between), trying
        each cap in turn, largest first, before stage 3 replaces them by a
        one-line placeholder.
    truncate_caps: stage 4 middle-truncates older non-tool messages longer
        than a cap to about that size (head, tail and the sentences carrying
        numbers or names), each cap in turn, largest first.
    keep_head_ratio: stage 5 keeps the opening of the history (task
        statement, first facts) up to this fraction of the target, and
        removes turns after it, oldest first.
    cut_quantum: stage 5 removes turns in steps of at least this fraction of
        the target. Coarse steps keep prompts cache-stable: the cut only moves
        once a whole step of history has accumulated, and then frees a whole
        step, so the next turns append again.
    aggressive_ratio: with `aggressive=True` the prompt is fitted to this
        fraction of the budget when possible, leaving headroom.
    protected_floor_tokens: stage 6 never trims a protected message (system
        prompt, latest turn) below about this size; below that, fit refuses.
    """

    tool_result_caps: tuple[int, ...] = (2048, 256)
    truncate_caps: tuple[int, ...] = (256,)
    keep_head_ratio: float = 0.3
    cut_quantum: float = 0.25
    aggressive_ratio: float = 0.7
    protected_floor_tokens: int = 256

    def __post_init__(self) -> None:
        for name in ("cut_quantum", "aggressive_ratio"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1]")
        if not 0.0 <= self.keep_head_ratio < 1.0:
            raise ValueError("keep_head_ratio must be in [0, 1)")
        for name in ("tool_result_caps", "truncate_caps"):
            caps = getattr(self, name)
            if not caps or list(caps) != sorted(set(caps), reverse=True):
                raise ValueError(f"{name} must be non-empty and decreasing")
        for size in (*self.tool_result_caps, *self.truncate_caps, self.protected_floor_tokens):
            if size < 32:
                raise ValueError("token sizes must be at least 32")
