"""`jobs`: run the platform locally (`up`, `worker`, `beat`, `flower`, `service`, `vendor`,
`demo`) and administer it (one `jobs/admin/<module>.py` per command group); `jobs --help`.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from jobs.admin.cancel import cancel_command
from jobs.admin.status import act, exit_on, fail, list_command, platform_app, platform_source
from jobs.embedded import (
    exec_postgres,
    port_in_use,
    postgres_ready,
    redis_command,
    redis_ready,
    wait_until,
)
from jobs.observe.snapshot import probe_broker
from jobs.observe.watchdog import EXIT_STALLED
from jobs.pipeline_view import describe_pipelines
from jobs.settings import Settings, SettingsError, get_settings
from jobs.tiers import TIERS
from jobs.vendor import VendorControl, VendorError, serve
from resilience.errors import ResilienceError
from resilience.pause import view as pause_view
from resilience.redact import redact, redact_url

cli = typer.Typer(help="Run and administer the job platform.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)

console = Console()
errors = Console(stderr=True)

#: Admin command groups, each `jobs/admin/<module>.py` exposing a `cli` Typer app.
ADMIN_COMMANDS = {"cancellations": "jobs.admin.cancel", **{
    name.replace("_", "-"): f"jobs.admin.{name}" for name in (
        "locks", "idempotency", "breakers", "dead_letters", "limits", "status", "health",
        "metrics", "outbox", "batches", "schedules", "workflows")}}


def settings_or_exit() -> Settings:
    """The settings, or a readable error and exit code 2."""
    with exit_on(SettingsError):
        return get_settings()


# -- running the platform ---------------------------------------------------------------
def procfile(settings: Settings) -> str:
    """The Procfile `jobs up` hands to honcho: services, vendor, workers, beat, relay, Flower..."""
    processes: list[tuple[str, tuple[str, ...]]] = []
    if settings.embedded_redis:
        processes.append(("redis", ("service", "redis")))
    if settings.embedded_redlock:
        processes += [(f"redlock{index + 1}", ("service", "redlock", "--node", str(index)))
                      for index in range(len(settings.embedded_redlock_ports))]
    if settings.embedded_postgres:
        processes.append(("postgres", ("service", "postgres")))
    if settings.simulated_vendor:
        processes.append(("vendor", ("vendor", "serve")))
    # honcho stops every process when one exits: a worker the watchdog ended for a stall
    # (status 75) is started again by `jobs worker` itself instead.
    processes += [(f"worker_{tier}", ("worker", tier, "--restart-on-stall")) for tier in TIERS]
    processes += [("beat", ("beat",)), ("outbox", ("outbox", "relay")), ("flower", ("flower",)),
                  ("metrics", ("metrics", "--port", str(settings.metrics_port)))]
    return "".join(f"{name}: exec {shlex.join([sys.executable, '-m', 'jobs', *args])}\n"
                   for name, args in processes)


@cli.command()
def up() -> None:
    """Start the whole platform under honcho; Ctrl-C stops every process."""
    settings = settings_or_exit()

    ports = [("JOBS_EMBEDDED_REDIS_PORT", settings.embedded_redis_port, settings.embedded_redis),
             ("JOBS_EMBEDDED_POSTGRES_PORT", settings.embedded_postgres_port,
              settings.embedded_postgres),
             *(("JOBS_EMBEDDED_REDLOCK_PORTS", int(port), settings.embedded_redlock)
               for port in settings.embedded_redlock_ports),
             ("JOBS_FLOWER_PORT", settings.flower_port, True),
             ("JOBS_METRICS_PORT", settings.metrics_port, True),
             ("JOBS_VENDOR_PORT", settings.vendor_port, settings.simulated_vendor)]
    busy = [f"{name}={port}" for name, port, used in ports if used and port_in_use(port)]
    if busy:
        raise fail(f"ports already in use: {', '.join(busy)}\nAnother platform may still run "
                   "(stop it), or choose free ports with those variables.")
    data = settings.data_dir.resolve()
    data.mkdir(parents=True, exist_ok=True)
    path = data / "Procfile"
    path.write_text(procfile(settings))
    # Workers write their histogram files here and `jobs metrics` sums them; a previous
    # run's files describe dead processes, so the folder starts empty.
    metrics_dir = data / "prometheus"
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    console.print(
        f"[bold]platform[/bold]: Redis {_where(settings.embedded_redis)}, PostgreSQL "
        f"{_where(settings.embedded_postgres)}, Redlock {_where(settings.embedded_redlock)}; "
        f"Flower on http://{settings.flower_address}:{settings.flower_port} (resilience view: "
        f"/resilience), metrics on :{settings.metrics_port}/metrics, payment vendor "
        f"{settings.effective_vendor_url}  (Procfile: {path})")
    os.execv(sys.executable, [sys.executable, "-m", "honcho", "-f", str(path), "-d",
                              str(Path.cwd()), "start"])


def _where(embedded: bool) -> str:
    return "embedded" if embedded else "from the environment"


@cli.command()
def service(
    name: Annotated[str, typer.Argument(help="redis, redlock or postgres")],
    node: Annotated[int, typer.Option(help="redlock node index")] = 0,
) -> None:
    """Run one embedded service in the foreground (honcho supervises it)."""
    settings = settings_or_exit()

    data = settings.data_dir.resolve()
    if name == "redis":
        command = redis_command(settings.embedded_redis_port, data / "redis")
    elif name == "redlock":
        port = int(settings.embedded_redlock_ports[node])
        # Redlock nodes keep no data across restarts on purpose: fencing tokens do not rely
        # on them (see README), and a restarted node must come back empty to be honest.
        command = redis_command(port, data / f"redlock{node}", persist=False)
    elif name == "postgres":
        exec_postgres(data / "postgres", settings.embedded_postgres_port)
        return
    else:
        raise fail(f"unknown service {name!r}; choose redis, redlock or postgres")
    os.execv(command[0], command)


def wait_for_services(settings: Settings, timeout_seconds: float = 60) -> None:
    """Block until Redis, the broker and PostgreSQL answer, then apply migrations."""
    # lazy: jobs.db loads alembic and SQLAlchemy
    from jobs.db import migrate

    wait_until(lambda: redis_ready(settings.effective_redis_url),
               timeout_seconds=timeout_seconds,
               what=f"Redis at {redact_url(settings.effective_redis_url)}")
    wait_until(lambda: postgres_ready(settings.effective_database_url),
               timeout_seconds=timeout_seconds, what="PostgreSQL")
    migrate(settings.effective_locks_database_url)


@cli.command()
def migrate() -> None:
    """Create the database if needed and apply every migration."""
    settings = settings_or_exit()
    # lazy: jobs.db loads alembic and SQLAlchemy
    from jobs.db import migrate as apply

    apply(settings.effective_locks_database_url)
    console.print("migrations applied")


@cli.command()
def worker(
    tier: Annotated[str, typer.Argument(help="critical, standard or optional")],
    loglevel: Annotated[str, typer.Option(help="Celery log level")] = "INFO",
    restart_on_stall: Annotated[bool, typer.Option(
        help="start the worker again when the consumption watchdog ends it for a stall "
             "(exit status 75); for supervisors that restart nothing (honcho)")] = False,
) -> None:
    """Run one tier's worker: `-Q <tier> -n <tier>@%h` with the tier's pool settings."""
    settings = settings_or_exit()
    if tier not in TIERS:
        raise fail(f"unknown tier {tier!r}; valid tiers are: {', '.join(TIERS)}")
    wait_for_services(settings)
    limits = settings.tier(tier)
    args = [sys.executable, "-m", "celery", "-A", "jobs", "worker", "-Q", tier, "-n",
            f"{tier}@%h", "-c", str(limits.concurrency), "--prefetch-multiplier",
            str(limits.prefetch_multiplier), "-E", "--loglevel", loglevel]
    if not restart_on_stall:
        os.execv(sys.executable, args)
    raise typer.Exit(run_restarting_on_stall(args))


def run_restarting_on_stall(args: list[str]) -> int:
    """Run `args` until it exits with another status than the watchdog's stall exit (75),
    forwarding SIGTERM, SIGINT and SIGQUIT to it; returns its last status."""
    child: subprocess.Popen[bytes] | None = None
    stopping = False

    def forward(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, forward)
    while True:
        child = subprocess.Popen(args)
        status = child.wait()
        if status != EXIT_STALLED or stopping:
            return status
        errors.print(f"[yellow]worker ended for a consumption stall (status {status}); "
                     "starting it again[/yellow]")
        time.sleep(1.0)


@cli.command()
def beat(loglevel: Annotated[str, typer.Option()] = "INFO") -> None:
    """Run Celery beat with the platform's schedule (jobs/schedule.py)."""
    settings = settings_or_exit()
    wait_for_services(settings)
    # One leader among N beats (resilience.locks.beat); the schedules live in PostgreSQL
    # (resilience.schedules), so beat keeps no local schedule file.
    args = [sys.executable, "-m", "celery", "-A", "jobs", "beat", "--loglevel", loglevel,
            "-S", "resilience.schedules.scheduler:Scheduler"]
    os.execv(sys.executable, args)


def require_broker(settings: Settings) -> None:
    """Exit with a clear message when the broker cannot be reached."""
    try:
        probe_broker(settings.effective_broker_url, timeout_seconds=2)
    except Exception as exc:  # noqa: BLE001 - any failure means: not reachable
        raise fail(f"cannot reach the broker at {redact_url(settings.effective_broker_url)}: "
                   f"{redact(str(exc))}\nStart the platform first (`make run`), or set "
                   "BROKER_URL/REDIS_URL.") from None


@cli.command()
def flower() -> None:
    """Run Flower; beyond loopback it requires FLOWER_BASIC_AUTH (never on the command line)."""
    settings = settings_or_exit()

    wait_until(lambda: redis_ready(settings.effective_redis_url), timeout_seconds=60,
               what="Redis")
    if settings.flower_basic_auth is not None:
        # Flower reads FLOWER_BASIC_AUTH itself; keeping it out of argv keeps it out of `ps`.
        os.environ["FLOWER_BASIC_AUTH"] = settings.flower_basic_auth.get_secret_value()
    else:
        # Loopback only (Settings refuses anything else without auth): the API may be open.
        os.environ["FLOWER_UNAUTHENTICATED_API"] = "true"
    # lazy: Flower and tornado, needed by `jobs flower` alone
    from jobs.observe.web import run_flower

    run_flower(platform_app(),
               [f"--address={settings.flower_address}", f"--port={settings.flower_port}"])


@cli.command()
def demo(
    fast: Annotated[bool, typer.Option(
        "--fast", help="no pauses between phases (tests, the impatient)")] = False,
    phase_seconds: Annotated[float | None, typer.Option(
        min=0, help="pause after each phase to look at Flower (default 8, --fast 0)")] = None,
    flood: Annotated[int | None, typer.Option(
        min=1, max=5000, help="accounts in the optional flood, each warmed twice "
        "(default 800, --fast 300)")] = None,
    steady: Annotated[bool, typer.Option(
        "--steady", help="instead: a steady mixed workload (--rate, --seconds)")] = False,
    rate: Annotated[float | None, typer.Option(
        min=0.1, help="steady workload: jobs per second (implies --steady)")] = None,
    seconds: Annotated[float | None, typer.Option(
        min=0, help="steady workload: stop after this long; 0 runs until Ctrl-C")] = None,
) -> None:
    """Show every guard at work on the example jobs, phase by phase, then a summary.

    Duplicated orders replayed, the vendor failing and the breaker deferring until it
    recovers, a double-triggered report skipped, an optional flood shed, a poison job
    dead-lettered. Needs the platform running (`jobs up`).
    """
    settings = settings_or_exit()
    require_broker(settings)
    # lazy: the demo imports the example tasks, which build the Celery app
    from jobs.demo import DemoError, DemoOptions, ensure_vendor, run_steady, run_story

    with exit_on(DemoError):
        vendor = ensure_vendor(settings, console)
    try:
        if steady or rate is not None or seconds is not None:
            run_steady(rate=rate or 10.0, seconds=seconds or 0, console=console)
            return
        given = {"flood": flood, "phase_seconds": phase_seconds}
        options = dataclasses.replace(DemoOptions.fast() if fast else DemoOptions(),
                                      **{k: v for k, v in given.items() if v is not None})
        if not run_story(platform_app(), options=options, console=console):
            raise typer.Exit(1)
    except DemoError as exc:
        raise fail(f"demo stopped: {exc}") from None
    except KeyboardInterrupt:
        errors.print("demo interrupted")
        raise typer.Exit(130) from None
    finally:
        if vendor is not None:
            vendor.shutdown()


vendor_cli = typer.Typer(help="The simulated payment vendor (started by `jobs up`): serve "
                         "it, switch its mode.", no_args_is_help=True)
cli.add_typer(vendor_cli, name="vendor")


def _vendor_switch(mode: str, delay_seconds: float | None = None) -> None:
    with exit_on(VendorError):
        state = VendorControl(settings_or_exit().effective_vendor_url).set_mode(
            mode, delay_seconds=delay_seconds)
    console.print(f"vendor: {state['mode']} (delay {state['delay_seconds']:g}s when slow; "
                  f"{state['calls']} calls, {state['charges']} charges so far)")


@vendor_cli.command("serve")
def vendor_serve(
    host: Annotated[str, typer.Option(help="bind address; beyond loopback for a container "
                                           "of its own (mode changes stay loopback-only)")]
    = "127.0.0.1",
) -> None:
    """Run the simulated vendor on 127.0.0.1:JOBS_VENDOR_PORT (what `jobs up` starts)."""
    settings = settings_or_exit()
    try:
        serve(settings.vendor_port, host)
    except OSError as exc:
        raise fail(f"cannot serve the vendor on {host}:{settings.vendor_port}: {exc} "
                   "(JOBS_VENDOR_PORT)") from None
    except KeyboardInterrupt:
        pass


@vendor_cli.command("ok")
def vendor_ok() -> None:
    """Answer every charge at once: the vendor recovered."""
    _vendor_switch("ok")


@vendor_cli.command("fail")
def vendor_fail() -> None:
    """Answer every charge with HTTP 503: the breaker opens once enough calls failed."""
    _vendor_switch("fail")


@vendor_cli.command("slow")
def vendor_slow(
    delay_seconds: Annotated[float, typer.Option(
        "--seconds", min=0, max=60, help="delay per charge (charges time out after 3 s)")] = 2.0,
) -> None:
    """Answer every charge after a delay: slow calls trip the breaker too."""
    _vendor_switch("slow", delay_seconds)


@vendor_cli.command("status")
def vendor_status() -> None:
    """The vendor's mode, calls received and distinct charges."""
    with exit_on(VendorError):
        state = VendorControl(settings_or_exit().effective_vendor_url).status()
    console.print_json(data=state)


@cli.command()
def config() -> None:
    """Show the effective configuration (secrets masked)."""
    settings = settings_or_exit()
    table = Table("setting", "value", title="configuration")
    table.add_row("redis", redact_url(settings.effective_redis_url))
    table.add_row("database", redact_url(settings.effective_database_url))
    table.add_row("broker", redact_url(settings.effective_broker_url))
    table.add_row("redlock", ", ".join(redact_url(u) for u in settings.effective_redlock_urls))
    table.add_row("visibility timeout", f"{settings.visibility_timeout_seconds}s")
    for tier in TIERS:
        table.add_row(f"tier {tier}", str(settings.tier(tier).model_dump()))
    console.print(table)


@cli.command()
def pipeline(
    task_name: Annotated[str, typer.Argument(help="registered task name")],
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Print a task's effective enqueue and execution pipelines, in order, with options."""
    settings_or_exit()
    app = platform_source().app
    task = app.tasks.get(task_name)
    if task is None:
        close = [name for name in app.tasks if task_name.rsplit(".", 1)[-1] in name]
        hint = f"; did you mean {', '.join(sorted(close)[:5])}?" if close else ""
        raise fail(f"no task named {task_name!r}{hint} (load your module with JOBS_IMPORTS)")
    view = describe_pipelines(task)
    if as_json:
        console.print_json(data=view, default=str)
        return
    if view.get("unguarded"):
        console.print(view["unguarded"], markup=False)
        return
    for phase in ("enqueue", "execution"):
        table = Table(title=f"{task_name}: {phase} pipeline (runs top to bottom)")
        for column in ("#", "stage", "guard", "options"):
            table.add_column(column, overflow="fold")
        for index, row in enumerate(view[phase], start=1):
            table.add_row(str(index), row["stage"], row["guard"], row["options_text"])
        console.print(table)


def _pause_form(tier: str | None, task: str | None, **extra: str) -> dict[str, str]:
    if (tier is None) == (task is None):
        raise fail("name a tier (jobs pause critical) or a task (--task NAME)")
    settings_or_exit()
    return {"scope": "tier" if tier is not None else "task", "name": tier or str(task), **extra}


@cli.command()
def pause(
    tier: Annotated[str | None, typer.Argument(help="tier to pause")] = None,
    task: Annotated[str | None, typer.Option("--task", help="pause one task instead")] = None,
    reason: Annotated[str, typer.Option(help="shown on every deferred job")] = (
        "paused by an operator"),
) -> None:
    """Pause a tier (or --task NAME) fleet-wide: its jobs are DEFERRED, none lost, none run."""
    act(pause_view.pause, _pause_form(tier, task, reason=reason))


@cli.command()
def resume(
    tier: Annotated[str | None, typer.Argument(help="tier to resume")] = None,
    task: Annotated[str | None, typer.Option("--task", help="resume one task instead")] = None,
) -> None:
    """Resume a paused tier (or --task NAME): its deferred jobs run again."""
    act(pause_view.resume, _pause_form(tier, task))


list_command(cli, "paused", pause_view.VIEW, "List the pause switches that are on (one SCAN: "
             "undeclared names too).", partial(pause_view.read, include_stored=True))


cli.command("cancel")(cancel_command)


def main() -> None:
    """Console-script entry point: resilience errors print as one clear message."""
    for name, module in ADMIN_COMMANDS.items():
        cli.add_typer(importlib.import_module(module).cli, name=name)
    try:
        cli()
    except ResilienceError as exc:  # a SettingsError too
        errors.print(f"[red]{type(exc).__name__}: {redact(str(exc))}[/red]")
        sys.exit(2)

