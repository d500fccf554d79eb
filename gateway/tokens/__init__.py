"""Prompt token counting and context-window resolution."""
