"""Result backends on which a final state stays final.

Celery's own race, closed here: `Task.retry` publishes the next attempt and only then
stores RETRY (`celery/app/task.py` `retry`, `celery/app/trace.py` `handle_retry`), and the
stock backends refuse to overwrite SUCCESS only. When the retrying process stalls::

    worker A (attempt 3)          worker B (attempt 4, the last)        result key
    publish attempt 4 ──────────▶ runs, fails
    (stalls ~100 ms)              store FAILURE ──────────────────────▶ FAILURE
    store RETRY ──────────────────────────────────────────────────────▶ RETRY  (for 24 h)

and `AsyncResult.get()` blocks, Flower shows a job still retrying. Here a write of a state
that is not ready (RETRY, STARTED, a custom progress state) never replaces a ready one
(SUCCESS, FAILURE, REVOKED: a dead letter is a FAILURE, a stopped outcome a SUCCESS), and a
ready write keeps Celery's rule (nothing replaces SUCCESS). The check is atomic in the store:
one Lua script on Redis (a WATCH transaction for a result serializer other than JSON), the
row lock Celery already takes on a database. Chord counters and group results are Celery's,
untouched.

`keep_final_states(app)` selects these backends for the app's `result_backend` URL, whatever
it is set to later (`redis://`, `rediss://`, `sentinel://`, `db+...://`); a URL of another
kind keeps Celery's backend. The platform sets the same mapping through `celery_config`
(`override_backends`, which Celery's loader reads with the configuration).
"""

from __future__ import annotations

import time
from typing import Any

from billiard.einfo import ExceptionWithTraceback
from celery import states
from celery.backends.database import DatabaseBackend as CeleryDatabaseBackend
from celery.backends.redis import RedisBackend as CeleryRedisBackend
from celery.backends.redis import SentinelBackend as CelerySentinelBackend
from celery.exceptions import BackendStoreError
from celery.worker.request import Request
from kombu.utils.encoding import bytes_to_str

from resilience.outcomes import OUTCOME_META_KEY, OUTCOME_REQUEST_ATTRIBUTE, OutcomeStored
from resilience.scripts import LuaScript

STORE = LuaScript.load(__file__, "results_store.lua")

#: What a write of each kind of state must not replace.
_KEPT_AGAINST_UNREADY = tuple(sorted(states.READY_STATES))
_KEPT_AGAINST_READY = (states.SUCCESS,)


def kept_against(state: str) -> tuple[str, ...]:
    """The stored states a write of `state` leaves in place: every ready state for a write
    that is not ready (RETRY, STARTED, ...), SUCCESS alone for a ready one (Celery's rule)."""
    return _KEPT_AGAINST_READY if state in states.READY_STATES else _KEPT_AGAINST_UNREADY


class _FinalRedisStates:
    """`_store_result` of Celery's Redis backends with the final-state check in the store
    (replacing Celery's GET-then-SET: one round trip instead of two), and a stopped job's
    guard decision in its metadata (`outcome`, read by `resilience.outcome_of`)."""

    def _get_result_meta(self, result: Any, state: str, traceback: Any, request: Any,
                         format_date: bool = True, encode: bool = False) -> dict[str, Any]:
        meta = super()._get_result_meta(  # type: ignore[misc]
            result, state, traceback, request, format_date=format_date, encode=encode)
        decision = getattr(request, OUTCOME_REQUEST_ATTRIBUTE, None)
        if decision is not None and state in states.READY_STATES:
            meta[OUTCOME_META_KEY] = decision
        return meta

    def _store_result(self, task_id: Any, result: Any, state: str, traceback: Any = None,
                      request: Any = None, **kwargs: Any) -> Any:
        meta = self._get_result_meta(result=result, state=state,  # type: ignore[attr-defined]
                                     traceback=traceback, request=request)
        meta["task_id"] = bytes_to_str(task_id)
        key = self.get_key_for_task(task_id)  # type: ignore[attr-defined]
        value = self.encode(meta)  # type: ignore[attr-defined]
        if isinstance(value, str) and len(value) > CeleryRedisBackend._MAX_STR_VALUE_SIZE:
            raise BackendStoreError("value too large for Redis backend", state=state,
                                    task_id=task_id)
        # As Celery's `_set_with_state`: a failure may live longer (result_failure_expires).
        expires = (self.failure_expires  # type: ignore[attr-defined]
                   if state == states.FAILURE else self.expires)  # type: ignore[attr-defined]
        try:
            self.ensure(self._store_unless_kept,  # type: ignore[attr-defined]
                        (key, value, int(expires or 0), kept_against(state)))
        except BackendStoreError as exc:
            raise BackendStoreError(str(exc), state=state, task_id=task_id) from exc
        return result

    def _store_unless_kept(self, key: str, value: Any, expires: int,
                           kept: tuple[str, ...]) -> bool:
        """Store and publish `value` unless the stored state is in `kept`; stored?"""
        client = self.client  # type: ignore[attr-defined]
        if self.serializer == "json":  # type: ignore[attr-defined]
            return bool(STORE(client, keys=[key], args=[value, expires, *kept]))
        return self._store_watched(client, key, value, expires, kept)

    def _store_watched(self, client: Any, key: str, value: Any, expires: int,
                       kept: tuple[str, ...]) -> bool:
        """The script's check for a serializer Lua cannot read: an optimistic transaction
        that starts again when the key changed between the read and the write."""
        import redis

        with client.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(key)
                    current = pipe.get(key)
                    if current is not None and self.decode_result(  # type: ignore[attr-defined]
                            current).get("status") in kept:
                        pipe.reset()
                        return False
                    pipe.multi()
                    pipe.set(key, value, ex=expires or None)
                    pipe.publish(key, value)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue


class RedisBackend(_FinalRedisStates, CeleryRedisBackend):
    """Celery's Redis result backend (`redis://`, `rediss://`); final states stay final."""


class SentinelBackend(_FinalRedisStates, CelerySentinelBackend):
    """Celery's Sentinel result backend (`sentinel://`); final states stay final."""


class DatabaseBackend(CeleryDatabaseBackend):
    """Celery's SQLAlchemy result backend (`db+...://`); final states stay final.

    Celery's `_store_result` locks an existing row (SELECT ... FOR UPDATE) before it calls
    `_update_result`, so the check below reads the state no other store can change until
    this transaction ends; two first writes of one id meet at the unique task id, and the
    one retried finds the row.
    """

    def _update_result(self, task: Any, result: Any, state: str, traceback: Any = None,
                       request: Any = None) -> Any:
        if task.status in kept_against(state):
            return None  # the row is written back unchanged
        return super()._update_result(task, result, state, traceback=traceback,
                                      request=request)


#: Celery backend aliases (`celery.app.backends.BACKEND_ALIASES`) mapped to these classes.
FINAL_STATE_BACKENDS: dict[str, str] = {
    "redis": "resilience.results:RedisBackend",
    "rediss": "resilience.results:RedisBackend",
    "sentinel": "resilience.results:SentinelBackend",
    "db": "resilience.results:DatabaseBackend",
    "database": "resilience.results:DatabaseBackend",
}


def keep_final_states(app: Any) -> None:
    """Make `app`'s result backend one of the above for its URL's scheme; safe to call
    twice. Call it before the app's backend is first used (`app.backend` is built once per
    thread)."""
    loader = app.loader
    loader.override_backends = {**loader.override_backends, **FINAL_STATE_BACKENDS}


class OutcomeRequest(Request):
    """The worker's request of a guarded task: a job stopped by a guard (`OutcomeStored`,
    raised once its result is stored) sends its own task event, `task-replayed`,
    `task-shed`, ..., where Celery would send none for an ignored job. It is sent from the
    worker's main process, by the same event dispatcher as `task-started`, so it follows
    it and obeys the worker's event settings (`-E`, Flower's `enable_events`); Celery's
    event state then shows the job as REPLAYED, SHED, ... (a custom state), never SUCCESS.
    """

    def on_failure(self, exc_info: Any, send_failed_event: bool = True,
                   return_ok: bool = False) -> Any:
        stopped = exc_info.exception
        if isinstance(stopped, ExceptionWithTraceback):
            stopped = stopped.exc
        if isinstance(stopped, OutcomeStored):
            fields = dict(stopped.fields)
            if self.time_start:  # as task-succeeded carries it: Flower's runtime column
                fields["runtime"] = max(0.0, time.time() - self.time_start)
            self.send_event(stopped.event, **fields)
        return super().on_failure(exc_info, send_failed_event=send_failed_event,
                                  return_ok=return_ok)
