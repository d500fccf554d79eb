"""The hop to the upstream: its HTTP client, the headers that cross, relaying its answers,
and recognising what its refusals mean (a context overflow, turns that must alternate)."""
