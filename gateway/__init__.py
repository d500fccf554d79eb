"""Context Gateway: an OpenAI-compatible proxy that fits requests into their model's context window."""

from gateway.offline import configure_offline

# Before anything imports tiktoken or litellm (library users included).
configure_offline()

__version__ = "0.1.0"
