"""Fit a request of any wire format: its chat view through `gateway.compress.fit`, then back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.compress import CompressionOptions, FitResult, fit
from gateway.compress.markers import join_user_runs
from gateway.tokens.counter import counter_for
from gateway.wire.base import ChatView, WireFormat


def fit_request(
    wire: WireFormat,
    payload: Mapping[str, Any],
    view: ChatView,
    *,
    model: str,
    budget: int,
    tokens: int,
    options: CompressionOptions,
    aggressive: bool = False,
) -> tuple[dict[str, Any] | None, FitResult, int]:
    """(the fitted body or None when unchanged, the fit's result, the fixed tokens).

    `tokens` is the request's whole count; what is not its messages (tool
    definitions, response schemas) is fixed: it counts against the budget but
    is never cut. Raises ContextBudgetExceeded when nothing fits.
    """
    fixed = tokens - counter_for(model).messages(view.messages)
    result = fit(
        view.messages, model=model, budget_tokens=budget - fixed, options=options, aggressive=aggressive
    )
    body = fitted_body(wire, payload, view, result, options) if result.stages else None
    return body, result, fixed


def fitted_body(
    wire: WireFormat,
    payload: Mapping[str, Any],
    view: ChatView,
    result: FitResult,
    options: CompressionOptions,
) -> dict[str, Any]:
    """The request with the fit's messages; with `markers: merged`, where it dropped messages, user
    messages in a row joined (gateway/compress/markers.py)."""
    if not (options.markers == "merged" and result.spans):
        return wire.emit(payload, view, result.messages)
    return wire.emit(payload, view, join_user_runs(result.messages, wire.text_part))
