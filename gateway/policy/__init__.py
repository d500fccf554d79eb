"""Teams: gateway keys, per-team limits and usage, enforced across replicas through Redis.

`enforcer.Policy` is what routes call (authenticate, admit, settle); `config` is the config
model (imported by settings, so this package imports nothing at its top level).
"""
