"""`jobs cancellations`: list, withdraw and restore cancellations (see jobs.admin.cancel)."""

from jobs.admin.cancel import listing as cli

__all__ = ["cli"]
