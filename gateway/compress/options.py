"""Every threshold of the compression pipeline, with its documented default."""

from __future__ import annotations

from dataclasses import dataclass

RESPONSES_SERVER_STATE = ("pass", "truncate_auto")
MARKER_STYLES = ("separate", "merged")


@dataclass(frozen=True)
class CompressionOptions:
    """Thresholds of `fit`. All sizes are tokens of the model's tokenizer.

    Every field is a config key: `compression.<field>` in
    config/gateway.example.yaml, `GATEWAY_COMPRESSION_<FIELD>` in the
    environment (lists comma-separated).

    tool_result_caps: stage 2 trims older tool results longer than a cap to
        about that size (head, tail and informative lines in between), trying
        each cap in turn, largest first, before stage 3 replaces them by a
        one-line placeholder (images in tool results go with them).
    truncate_caps: stage 4 middle-truncates older non-tool messages longer
        than a cap to about that size (head, tail and the sentences carrying
        numbers or names), each cap in turn, largest first; its last rung then
        replaces old images, audio and files by a one-line placeholder.
    rung_headroom: a rung of stages 1-4 is climbed only if, where the history
        first overflowed the rung before it, it leaves at least this share of
        the room for the history free; otherwise it is skipped for the next
        one (after the last one: the drop phase). The trade-off: such a rung
        would last only a few turns, and every rung change re-cuts the
        history from the first message it changes, so the prompt cache misses
        almost entirely; skipping it saves that miss at the price of
        compressing harder a little earlier. 0 climbs every rung. The
        decision is taken where the rung first became needed, a fixed point
        of a growing conversation, so later requests never switch back; a
        prompt that fits is always returned untouched.
    keep_head_ratio: stage 5 keeps the opening of the history (task
        statement, first facts) up to this share of the budget, and removes
        turns after it, oldest first. Everything up to the cut stays cached
        when the cut moves: a bigger head keeps more of the prompt cached and
        leaves less room for recent turns.
    cut_quantum: stage 5 removes turns in steps of at least this share of
        the budget. Coarse steps keep prompts cache-stable: the cut only moves
        once a whole step of history has accumulated, and then frees a whole
        step, so the next turns append again; the price is up to a step of
        the budget left unused. Head and steps are shares of the budget, not
        of the aggressive target, so both modes cut on the same grid. (Older
        steps of an agent loop also have finer cuts: recent_steps_ratio.)
    recent_steps_ratio: in the latest turn, the steps after the user message
        (an agent loop: each assistant tool call with its results) are
        protected from the newest back, at least the newest one, as long as
        they fit within this share of the budget, or further while they fit
        the room left with every older message at its placeholder form.
        Older steps go straight to their aged form (the call stays: see
        aged_step_cap) and are dropped like older turns, oldest first. The
        boundary moves on the `cut_quantum` grid (by whole quanta of the turn's steps), so
        consecutive requests of a loop keep sharing their prefix. Older steps
        are also dropped at that grid's points (finer than the drop grid in
        their placeholder sizes) when that leaves the recent steps room for
        this share, so about as many go as needed, and such a cut stays put
        until the window moves.
    aged_step_cap: an older step of an agent loop, aged out of the recent
        window, keeps its tool calls with their results as one-line notes (and
        any image as a placeholder), and its assistant text and long call
        arguments middle-truncated to about this size (head, tail, sentences
        with facts). Agents that reason aloud before each call spend a quarter
        to a half of a loop on that text; kept whole, few aged steps fit and
        the rest are dropped, calls and all (measured on public agent
        transcripts: README, Agent loops).
    fill_quantum: the rung that fits (one cap, or a placeholder, for every old
        tool output) can leave much of the budget unused; the room left goes to
        the newest old turns, which stay at the rung before it (aged steps
        of an agent loop are placeholders at least). Where
        that starts moves on a grid of this share of the budget (in the sizes
        at the fitting rung), only forward as the conversation grows, so the
        prompt keeps its prefix between moves. A finer grid uses more of the
        budget and moves more often (each move re-sends the turns it passes in
        their smaller form); 0 (the default) turns it off: the whole history at
        one rung, the most cache-stable (measured trade-off: README).
    digest_ratio: each marker standing for dropped turns (or dropped steps of
        an agent loop) carries an account of them within this share of the
        budget, at most half the dropped tokens: an LLM summary of that exact
        span when one is available, else the extractive digest (the user's
        instructions verbatim, then facts, decisions and errors, then tool
        calls; corrected values replace the old ones). The room is reserved
        when choosing the cut, so a bigger share drops turns a little earlier;
        0 turns accounts off (a bare count, as before).
    aggressive_ratio: with `aggressive=True` the prompt is fitted to this
        share of the budget when possible, leaving headroom; it never keeps
        more than the plain fit of the same budget, and never trims a
        protected message that the plain fit keeps whole.
    protected_floor_tokens: stage 6 never trims a protected message (system
        prompt, latest user message, newest step) below this size; below
        that, fit refuses.
    responses_server_state: not read by `fit`: what the gateway does with a
        Responses request whose history lives on the upstream
        (`previous_response_id` or `conversation`), which no proxy can
        compress. `pass` forwards it as it is; `truncate_auto` measures it
        with the upstream's `POST /v1/responses/input_tokens` and asks the
        upstream to truncate (`truncation: "auto"`) when it does not fit, or
        when the upstream answers an overflow.
    markers: not read by `fit` (see `join_user_runs`): how the markers of
        dropped spans go upstream. `separate` (the default): each is a user
        message of its own, beside a user message (strict APIs accept two in
        a row; Anthropic merges them). `merged`: where the fit dropped
        messages, user messages in a row (markers included) are joined into
        one, for chat templates that refuse two in a row (Gemma's and several
        of Mistral's, served by vLLM or llama.cpp: "Conversation roles must
        alternate user/assistant/...").
    """

    tool_result_caps: tuple[int, ...] = (2048, 256)
    truncate_caps: tuple[int, ...] = (256,)
    rung_headroom: float = 0.2
    keep_head_ratio: float = 0.3
    cut_quantum: float = 0.25
    recent_steps_ratio: float = 0.5
    aged_step_cap: int = 32
    fill_quantum: float = 0.0
    digest_ratio: float = 0.1
    aggressive_ratio: float = 0.7
    protected_floor_tokens: int = 256
    responses_server_state: str = "pass"
    markers: str = "separate"

    def __post_init__(self) -> None:
        for name in ("cut_quantum", "aggressive_ratio", "recent_steps_ratio"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1]")
        for name in ("keep_head_ratio", "rung_headroom", "digest_ratio", "fill_quantum"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1)")
        for name in ("tool_result_caps", "truncate_caps"):
            caps = getattr(self, name)
            if not caps or list(caps) != sorted(set(caps), reverse=True):
                raise ValueError(f"{name} must be non-empty and decreasing")
        if self.responses_server_state not in RESPONSES_SERVER_STATE:
            raise ValueError("responses_server_state must be pass or truncate_auto")
        if self.markers not in MARKER_STYLES:
            raise ValueError("markers must be separate or merged")
        for name in ("tool_result_caps", "truncate_caps", "aged_step_cap", "protected_floor_tokens"):
            sizes = getattr(self, name)
            if min(sizes if isinstance(sizes, tuple) else (sizes,)) < 32:
                raise ValueError(f"{name} must be at least 32 tokens")
