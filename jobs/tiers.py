"""The three tiers: separate queues, separate worker pools, separate limits."""

from __future__ import annotations

from resilience.errors import UnknownTierError

CRITICAL = "critical"
STANDARD = "standard"
OPTIONAL = "optional"

#: Every tier, most important first. A tier's queue has the tier's name.
TIERS: tuple[str, ...] = (CRITICAL, STANDARD, OPTIONAL)

#: The tier of a task that names none.
DEFAULT_TIER = STANDARD


def validate_tier(name: object) -> str:
    """Return `name` if it is a configured tier.

    Raises:
        UnknownTierError: naming the valid tiers.
    """
    if name not in TIERS:
        raise UnknownTierError(f"unknown tier {name!r}; valid tiers are: {', '.join(TIERS)}",
                               tier=name, valid=TIERS)
    return str(name)
