"""Fit chat conversations into a token budget: a pure library, no I/O.

from gateway.compress import fit
result = fit(messages, model="gpt-4o", budget_tokens=120_000)
"""

from gateway.compress.fit import ContextBudgetExceeded, FitResult, fit
from gateway.compress.options import CompressionOptions

__all__ = ["CompressionOptions", "ContextBudgetExceeded", "FitResult", "fit"]
