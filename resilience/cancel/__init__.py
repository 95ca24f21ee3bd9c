"""Cancellation that sticks: `jobs cancel ID` / `--task NAME --key KEY` stop a job on every
worker and every redelivery, until the cancellation expires (see guard.py, tombstones.py)."""

from resilience.cancel.backends import CancelBackend, id_target, key_target
from resilience.cancel.backends.memory import MemoryCancelBackend
from resilience.cancel.backends.redis import RedisCancelBackend
from resilience.cancel.guard import CANCEL_KEY_OPTION, CancelConfig, CancelGuard
from resilience.cancel.results import store_cancelled
from resilience.cancel.tombstones import DEFAULT_TTL_SECONDS, Cancellation, Cancellations

__all__ = ["CANCEL_KEY_OPTION", "DEFAULT_TTL_SECONDS", "CancelBackend", "CancelConfig",
           "CancelGuard", "Cancellation", "Cancellations", "MemoryCancelBackend",
           "RedisCancelBackend", "id_target", "key_target", "store_cancelled"]
