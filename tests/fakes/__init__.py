"""Test doubles shared by unit, integration and benchmark code: the fake OpenAI upstream, served."""
