"""Parse and validate each wire format the gateway speaks, before anything else reads it."""
