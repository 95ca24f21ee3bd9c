"""The Celery app: three tier queues, JSON only, late acks, guards on every task."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from celery import Celery, signals
from kombu import Exchange, Queue

from jobs.observe.backlog import stamp_published_at
from jobs.observe.tracing import install_tracing, tracing_enabled
from jobs.settings import Settings, TierSettings, get_settings
from jobs.tiers import DEFAULT_TIER, TIERS, validate_tier
from resilience.admission import AdmissionGuard, BulkheadConfig, depth_backend_for
from resilience.app import init_app
from resilience.cancel import CancelConfig, CancelGuard, RedisCancelBackend
from resilience.deadletter.poison import PoisonConfig, PoisonGuard
from resilience.deadline import DeadlineConfig, DeadlineGuard, DeadlineStampGuard
from resilience.errors import ConfigurationError
from resilience.pause import PauseConfig, PauseGuard, RedisPauseBackend
from resilience.results import FINAL_STATE_BACKENDS
from resilience.stores import stores_for
from resilience.task import GuardedTask
from resilience.workflows.signals import connect as connect_workflow_signals


class JobTask(GuardedTask):
    """Base class of every platform task: guarded, tiered, acknowledged late."""

    #: The tier (queue and worker pool) the task runs in.
    tier: str = DEFAULT_TIER
    #: Acknowledge after the body ran, so a crashed worker's message is delivered again.
    acks_late = True
    #: A worker process killed mid-task requeues the message instead of failing it.
    reject_on_worker_lost = True
    #: Seconds from enqueue until the job is shed unrun (outcome SHED); None takes the
    #: tier's `JOBS_<TIER>__DEADLINE_SECONDS`.
    deadline_seconds: float | None = None

    def _per_settings(self, name: str, build: Callable[[TierSettings], Any]) -> Any:
        """What `build(the tier's settings)` returns, built once per settings object and
        deadline_seconds: every `.delay()` and every job asks."""
        cached = self.__dict__.get(name)
        if (cached is None or cached[0] is not self.app.settings
                or cached[1] != self.deadline_seconds):
            built = build(self.app.settings.tier(self.tier))
            cached = (self.app.settings, self.deadline_seconds, built)
            setattr(self, name, cached)
        return cached[2]

    def admission_config(self) -> BulkheadConfig:
        """The tier bulkhead of this task, from the tier's settings."""
        return self._per_settings("_admission_config", lambda limits: BulkheadConfig(
            tier=self.tier, max_queue_depth=limits.max_queue_depth,
            policy=limits.rejection_policy, wait_timeout_seconds=limits.wait_timeout_seconds))

    def deadline_policy(self) -> DeadlineConfig:
        """When this task's jobs are shed: its own deadline_seconds, else the tier's."""
        return self._per_settings("_deadline_policy", self._build_deadline_policy)

    def _build_deadline_policy(self, limits: TierSettings) -> DeadlineConfig:
        seconds = self.deadline_seconds or limits.deadline_seconds
        pressure_depth = limits.shed_queue_depth
        if pressure_depth is None and seconds is not None:
            pressure_depth = max(1, limits.max_queue_depth // 2)
        return DeadlineConfig(deadline_seconds=seconds, pressure_queue_depth=pressure_depth,
                              pressure_deadline_factor=limits.shed_deadline_factor,
                              tier=self.tier)

    #: Every platform task: the tier bulkhead at enqueue, and a deadline stamped on the
    #: message. A task's own guard of the same name (e.g. `@bulkhead`) replaces the default.
    enqueue_guards = (
        AdmissionGuard(lambda task: task.admission_config()),
        DeadlineStampGuard(lambda task: task.deadline_policy()),
    )
    #: Every platform task: poison messages are dead-lettered after JOBS_MAX_DELIVERIES
    #: deliveries that never returned; expired jobs are shed before they take a slot; a
    #: paused tier or task defers its jobs (`jobs pause`); a cancelled job never starts
    #: (`jobs cancel`).
    guards = (
        PoisonGuard(PoisonConfig(max_deliveries=get_settings().max_deliveries)),
        DeadlineGuard(
            lambda task: task.deadline_policy(),
            depth=lambda task, queue: depth_backend_for(task.app).depth(queue),
        ),
        PauseGuard(PauseConfig(), lambda task: pause_backend(task.app)),
        CancelGuard(CancelConfig(), lambda task: RedisCancelBackend(stores_for(task.app).redis)),
    )


connect_workflow_signals()  # step outcomes no guard sees (revoked, hard time limit)


class JobsCelery(Celery):
    """Celery with one extra task option, `tier`, checked when the task is defined."""

    settings: Settings

    def task(self, *args: Any, **options: Any) -> Any:
        """`@app.task(tier="critical", ...)`; an unknown tier fails at import time.

        Raises:
            UnknownTierError: `tier` is not one of the configured tiers.
            ConfigurationError: a time limit the broker's visibility timeout cannot cover.
        """
        if len(args) == 1 and callable(args[0]) and not options:
            return self.task()(args[0])
        tier = validate_tier(options.setdefault("tier", DEFAULT_TIER))
        limits = self.settings.tier(tier)
        options.setdefault("queue", tier)
        options.setdefault("base", JobTask)
        options.setdefault("soft_time_limit", limits.soft_time_limit_seconds)
        options.setdefault("time_limit", limits.hard_time_limit_seconds)
        if not issubclass(options["base"], GuardedTask):
            raise ConfigurationError(
                f"base={options['base'].__name__} must subclass JobTask so guards and tiers apply")
        if self.settings.broker_is_redis and options["time_limit"] and (
            options["time_limit"] + 30 > self.settings.visibility_timeout_seconds):
            raise ConfigurationError(
                f"time_limit={options['time_limit']}s is too close to the broker visibility "
                f"timeout ({self.settings.visibility_timeout_seconds}s): the message would be "
                "delivered again while the task still runs; lower it or raise "
                "JOBS_VISIBILITY_TIMEOUT_SECONDS")
        return super().task(*args, **options)


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery configuration derived from the platform settings."""
    exchange = Exchange("jobs", type="direct")
    config: dict[str, Any] = {
        "broker_url": settings.effective_broker_url,
        "result_backend": settings.effective_result_backend_url,
        # Celery's loader reads this: on these backends a late RETRY or STARTED never
        # replaces a final state (resilience.results).
        "override_backends": FINAL_STATE_BACKENDS,
        # A worker cut from the result backend's Redis learns it in seconds (Celery's
        # defaults: 120 s reads, connects unbounded), as the guards' own clients do.
        "redis_socket_timeout": 5.0, "redis_socket_connect_timeout": 5.0,
        "broker_connection_retry_on_startup": True,
        # JSON only: a pickle message can run arbitrary code in the worker.
        "task_serializer": "json", "result_serializer": "json", "event_serializer": "json",
        "accept_content": ["json"], "result_accept_content": ["json"],
        # At-least-once: ack after the body, requeue when the worker process is lost.
        "task_acks_late": True, "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # Messages that cannot become a task call are dead-lettered, never dropped and never
        # allowed to stop the worker (resilience.deadletter.intake).
        "worker_consumer": "resilience.deadletter.intake:IntakeConsumer",
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "task_queues": [Queue(tier, exchange, routing_key=tier,
                              queue_arguments=queue_arguments(settings, tier))
                        for tier in TIERS],
        "task_default_queue": DEFAULT_TIER, "task_default_exchange": "jobs",
        "task_default_routing_key": DEFAULT_TIER, "task_create_missing_queues": False,
        # Flower: events, started state, names and arguments on results.
        "worker_send_task_events": True, "task_send_sent_event": True,
        "task_track_started": True, "result_extended": True,
        "result_expires": 24 * 3600, "timezone": "UTC", "enable_utc": True,
        "imports": ["jobs.examples", "jobs.maintenance", "jobs.observe.worker", *settings.imports],
        "resilience_max_payload_bytes": settings.max_payload_bytes,
        "resilience_max_countdown_seconds": settings.max_countdown_seconds,
    }
    if settings.effective_broker_url.startswith("redis://"):
        # kombu's Redis transport with one client object per channel (see jobs.broker).
        config["broker_transport"] = "jobs.broker:Transport"
    if settings.broker_is_redis:
        # Deliberate: longer than any hard time limit or countdown (validated in Settings).
        config["broker_transport_options"] = {
            "visibility_timeout": settings.visibility_timeout_seconds,
            **restore_sweep(settings.visibility_timeout_seconds),
        }
        config["result_backend_transport_options"] = {
            "visibility_timeout": settings.visibility_timeout_seconds,
        }
    else:
        # RabbitMQ bounds each tier queue itself (`queue_arguments`); publisher confirms
        # make a publish to a full queue fail (nack) instead of vanishing.
        config["broker_transport_options"] = {"confirm_publish": True}
    return config


def restore_sweep(visibility_timeout_seconds: float) -> dict[str, int]:
    """kombu's Redis options: sweep expired unacknowledged messages every tenth of the
    visibility timeout (1-10 s). kombu's default (every 10th tick of 10 s) brought a lost
    worker's message back up to 100 s late; a sweep is one lock and one range read.

    The sweep's lock expires after three sweep intervals instead of kombu's 300 s: a worker
    SIGKILLed (or cut off) while sweeping leaves the lock behind, and until it expires no
    worker restores anything. Two sweeps overlapping after an early expiry restore nothing
    twice: each message is moved back in a WATCH transaction on the unacked hash."""
    interval = int(min(10, max(1, visibility_timeout_seconds // 10)))
    return {"unacked_restore_interval": interval, "unacked_restore_throttle": 1,
            "unacked_mutex_expire": 3 * interval}


def queue_arguments(settings: Settings, tier: str) -> dict[str, Any] | None:
    """The tier queue's declare arguments: on RabbitMQ, the tier's depth limit enforced by the
    broker (docs/overload.md); none on Redis (the publish script bounds the queue)."""
    if settings.broker_is_redis:
        return None
    return {"x-max-length": settings.tier(tier).max_queue_depth,
            "x-overflow": "reject-publish"}


def load_beat_schedule(module: str = "jobs.schedule") -> dict[str, Any]:
    """The periodic tasks declared in `module` (an empty schedule is valid): by default the
    platform's own, inside its package, so no `beat_schedule.py` on sys.path replaces it.

    Raises:
        ConfigurationError: the module declares no `SCHEDULE` dict (never read as empty).
    """
    schedule = getattr(importlib.import_module(module), "SCHEDULE", None)
    if schedule is None:
        raise ConfigurationError(f"{module} declares no SCHEDULE (write SCHEDULE = {{}} for none)")
    if not isinstance(schedule, dict):
        raise ConfigurationError(f"{module}.SCHEDULE must be a dict, not {type(schedule)}")
    return schedule


#: Library settings the platform still takes from its environment (documented fallbacks):
#: variable -> (`app.conf` key, its type).
_RESILIENCE_ENVIRONMENT = {
    "RESILIENCE_LOCK_SESSION_IDLE_SECONDS": ("resilience_lock_session_idle_seconds", float),
    "RESILIENCE_BEAT_POLL_SECONDS": ("resilience_beat_poll_seconds", float),
    "RESILIENCE_BEAT_SCHEDULE": ("resilience_beat_schedule", str),
    "RESILIENCE_SCHEDULE_OVERLAP_TRUST_SECONDS": ("resilience_schedule_overlap_trust_seconds",
                                                  float),
    "RESILIENCE_SCHEDULE_HISTORY_DAYS": ("resilience_schedule_history_days", float),
}


def resilience_config(settings: Settings) -> dict[str, Any]:
    """The guard library's part of the settings, as the `app.conf` keys it reads
    (`resilience.init_app`), with the `_RESILIENCE_ENVIRONMENT` variables that are set.

    Raises:
        ConfigurationError: a number that does not parse.
    """
    config: dict[str, Any] = {
        "resilience_redis_url": settings.effective_redis_url,
        "resilience_database_url": settings.effective_database_url,
        "resilience_redlock_urls": list(settings.effective_redlock_urls),
        "resilience_locks_database_url": settings.locks_database_url,
        "resilience_pool_mode": settings.pg_pool_mode,
    }
    for variable, (key, kind) in _RESILIENCE_ENVIRONMENT.items():
        if value := os.environ.get(variable, "").strip():
            try:
                config[key] = kind(value)
            except ValueError:
                raise ConfigurationError(f"{variable} must be a number, got {value!r}") from None
    return config


def create_app(settings: Settings | None = None) -> JobsCelery:
    """Build the platform's Celery app from `settings` (default: the environment)."""
    settings = settings or get_settings()
    app = JobsCelery("jobs", set_as_current=True)
    app.settings = settings
    app.config_from_object(celery_config(settings))
    app.conf.beat_schedule = load_beat_schedule()
    app.conf.update(resilience_config(settings))
    init_app(app)
    stores_for(app)  # built now: a bad URL stops the platform at startup, not at first use
    # Every publish carries its time: the age of a tier's oldest message (observe/backlog.py).
    signals.before_task_publish.connect(stamp_published_at, weak=False)
    if tracing_enabled():  # OTEL_TRACES_EXPORTER set: docs/observe.md "Tracing"
        install_tracing()
    return app


@signals.celeryd_init.connect
def apply_tier_worker_settings(
    sender: Any = None, instance: Any = None, conf: Any = None, options: Any = None, **_: Any
) -> None:
    """`celery -A jobs worker -Q critical` takes the critical tier's pool settings."""
    queues = (options or {}).get("queues")
    names = queues.split(",") if isinstance(queues, str) else list(queues or [])
    names = [name.strip() for name in names if name and name.strip()]
    if conf is None or options is None or len(names) != 1 or names[0] not in TIERS:
        return
    settings: Settings = getattr(getattr(instance, "app", None), "settings", None) or get_settings()
    limits = settings.tier(names[0])
    # `options` is a copy of the worker's keyword arguments; unset CLI values fall back to
    # these configuration keys, so setting them here fills only what the user left unset.
    if not options.get("concurrency"):
        conf.worker_concurrency = limits.concurrency
    if not options.get("prefetch_multiplier"):
        conf.worker_prefetch_multiplier = limits.prefetch_multiplier


def pause_backend(app: Celery) -> RedisPauseBackend:
    """The fleet's pause switches, in the app's shared Redis."""
    return RedisPauseBackend(stores_for(app).redis)

