"""LLM summaries of dropped spans: the I/O around the pure engine (cache, lock, upstream call).

`fit()` reports the spans it drops; `Summarizer` looks their summaries up in
the store (shared by replicas), makes missing ones (one call per span across
replicas), and `fit()` uses a summary instead of the digest when it has one.
"""

from gateway.summarize.summarizer import Summarizer

__all__ = ["Summarizer"]
