"""`init_app(app)`: bind the guard library to a Celery app the user already has.

    app = Celery("shop")
    app.conf.resilience_redis_url = "redis://localhost:6379/1"
    resilience.init_app(app)

A task whose function carries guards (and, on an initialised app, every task but Celery's
own, for the library's default guards) gets its class swapped for
`type(name, (GuardedTask, its class), {})` when it is created, when the app is finalized,
and at `init_app`. On an app never initialised such a task's class refuses to send or run
instead: a guard is never a silent no-op. How, and the one gap: docs/library.md.
Nothing reads `app.conf` or connects here (Django may not have loaded its settings yet).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from celery import Task
from celery._state import _get_active_apps, connect_on_app_finalize
from celery.utils.imports import symbol_by_name
from celery.worker.request import Request

from resilience.errors import ConfigurationError
from resilience.pipeline import attached
from resilience.results import OutcomeRequest, keep_final_states
from resilience.stores import from_app_conf
from resilience.task import GuardedTask

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["init_app", "is_initialised"]

logger = logging.getLogger("resilience.app")

#: On an app whose hooks are installed: whether it is initialised.
_STATE_ATTRIBUTE = "_resilience_state"
#: On a class this module made: the task class it was made from.
_ORIGINAL_ATTRIBUTE = "_resilience_original_class"
#: GuardedTask's options a task may set (`@app.task(max_payload_bytes=...)`): a swapped
#: class keeps the task's own values, which GuardedTask's defaults would otherwise shadow.
_TASK_OPTIONS = ("guards", "enqueue_guards", "max_payload_bytes")

_hooks_lock = threading.RLock()
_classes: dict[tuple[type, bool], type] = {}


def init_app(app: Celery) -> Celery:
    """Make the guard decorators apply to every task of `app`; safe to call twice. The
    stores come from `app.conf.resilience_*` on first use (docs/library.md), unless
    `resilience.stores.install` gave some. Call it before `app.backend` is first used: the
    result backend becomes `resilience.results`'s for its scheme (`keep_final_states`).

    Returns:
        `app`, so `app = resilience.init_app(Celery(...))` reads well.
    """
    with _hooks_lock:
        _install_hooks(app)
        if is_initialised(app):
            return app
        setattr(app, _STATE_ATTRIBUTE, True)
        keep_final_states(app)
        from_app_conf(app)
        _rebase_all(app)
    return app


def is_initialised(app: Celery) -> bool:
    """Whether `init_app(app)` was called."""
    return app.__dict__.get(_STATE_ATTRIBUTE) is True


# -- hooks ---------------------------------------------------------------------------------
def _install_hooks(app: Celery) -> None:
    """Hook task creation and finalization of `app`, once; nothing is read from its conf."""
    with _hooks_lock:
        if _STATE_ATTRIBUTE in app.__dict__:
            return
        setattr(app, _STATE_ATTRIBUTE, False)

        create = app._task_from_fun

        def task_from_fun(fun: Any, *args: Any, **options: Any) -> Any:
            return _rebase(app, create(fun, *args, **options))

        # Every task Celery makes from a function passes here: `@app.task` on a finalized
        # app, `@shared_task` (its constructor looks the method up on the app each time).
        app._task_from_fun = task_from_fun  # type: ignore[method-assign]

        # A lazy `@app.task` captured the original method when it was decorated: the tasks
        # it makes have the app's base class, whose `on_bound` runs once each is registered.
        base = app.Task

        def on_bound(cls: Any, bound_app: Any) -> None:
            super(hooked, cls).on_bound(bound_app)
            task = bound_app._tasks.get(getattr(cls, "name", None))
            if type(task) is cls:
                _rebase(bound_app, task)

        hooked = type(base.__name__, (base,), {
            "on_bound": classmethod(on_bound), "__module__": base.__module__,
            "__qualname__": base.__qualname__, "abstract": True})
        app.Task = hooked
        app.on_after_finalize.connect(_rebase_all, weak=False)


def _arm(app: Celery) -> None:
    """Any app finalized in this process: its guarded tasks are guarded or refuse to run."""
    _install_hooks(app)
    _rebase_all(app)


def _rebase_all(sender: Any = None, **_: Any) -> None:
    """`_rebase` every task of the app `sender` (also an `on_after_finalize` receiver)."""
    for task in list(sender._tasks.values()):
        _rebase(sender, task)


def _rebase(app: Any, task: Any) -> Any:
    """Give `task` the class its guards need: guarded on an initialised app, refusing on
    one that was never initialised. A task with no guards, or whose own class is a
    `GuardedTask`, is left as it is."""
    cls = type(task)
    original = cls.__dict__.get(_ORIGINAL_ATTRIBUTE, cls)
    if original is cls and isinstance(task, GuardedTask):
        return task  # guarded by its own class (the platform's JobTask, base=GuardedTask)
    try:
        guarded = bool(attached(task.run))
    except Exception:  # noqa: BLE001 - a task class without a usable run has no guards
        guarded = False
    initialised = is_initialised(app)
    # Without guards a task still takes the library's default guards (a durable workflow
    # step), except Celery's own (`celery.*`: chord_unlock, backend_cleanup, ...).
    celery_own = str(getattr(task, "name", "") or "").startswith("celery.")
    if not guarded and (celery_own or not initialised):
        return task
    wanted = _class_for(original, initialised)
    if cls is not wanted:
        task.__class__ = wanted
    return task


def _class_for(original: type, initialised: bool) -> type:
    """The class a guarded task of class `original` takes (made once per class)."""
    with _hooks_lock:
        made = _classes.get((original, initialised))
        if made is None:
            mixin = GuardedTask if initialised else _NotInitialisedTask
            namespace = {name: original.__dict__[name] for name in _TASK_OPTIONS
                         if name in original.__dict__}
            if initialised:
                request = _request_for(original)
                if request is not None:
                    namespace["Request"] = request
            namespace.update({_ORIGINAL_ATTRIBUTE: original, "__module__": original.__module__,
                              "__qualname__": original.__qualname__})
            made = _classes[(original, initialised)] = type(original.__name__,
                                                            (mixin, original), namespace)
            shadowed = _own_call(original)
            if initialised and shadowed is not None:
                logger.warning(
                    "%s.__call__ does not run for guarded tasks (GuardedTask.__call__ runs the "
                    "guards and the body): move its setup to a task_prerun signal, or make it "
                    "a GuardedTask subclass given as base= (docs/library.md)",
                    shadowed.__qualname__)
        return made


def _request_for(original: type) -> type | None:
    """A worker request class deriving from the library's `OutcomeRequest` and `original`'s
    own, if it has one (both call `super()`), so neither silently replaces the other."""
    own = symbol_by_name(original.Request)
    if own is Request or issubclass(own, OutcomeRequest):
        return None
    if not (isinstance(own, type) and issubclass(own, Request)):
        raise ConfigurationError(
            f"{original.__qualname__}.Request must subclass celery.worker.request.Request "
            f"to be guarded, got {own!r}")
    return type(own.__name__, (OutcomeRequest, own), {"__module__": own.__module__,
                                                      "__qualname__": own.__qualname__})


def _own_call(cls: type) -> type | None:
    """The class above Celery's `Task` that defines `__call__` for `cls`, if any."""
    for klass in cls.__mro__:
        if klass in (Task, GuardedTask, object):
            return None
        if "__call__" in klass.__dict__:
            return klass
    return None


class _NotInitialisedTask(Task):
    """A guarded task of an app `init_app` was never called for: its guards would be
    ignored, so it refuses to be sent or run."""

    def _refuse(self) -> ConfigurationError:
        names = sorted({guard.name for guard in attached(self.run)})
        return ConfigurationError(
            f"{self.name} has guards ({', '.join(names)}) but its Celery app "
            f"{self.app.main!r} was never initialised, so they would be ignored: call "
            "resilience.init_app(app) where the app is created",
            task=self.name)

    def apply_async(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse()


connect_on_app_finalize(_arm)
# Apps made before the first guard was imported (a Django project's celery.py) are hooked
# now, so even a lazy `@app.task` evaluated before finalization meets the hooks.
for _existing in list(_get_active_apps()):
    _install_hooks(_existing)
