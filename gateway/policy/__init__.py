"""Teams: gateway keys, per-team limits and usage, enforced across replicas through Redis."""

from gateway.policy.enforcer import Admission, Policy, Team
from gateway.policy.limits import Usage

__all__ = ["Admission", "Policy", "Team", "Usage"]
