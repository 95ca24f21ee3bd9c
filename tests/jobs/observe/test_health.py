"""`jobs health live` (the worker's loop runs) apart from `jobs health ready` (stores up)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jobs.embedded import embedded_redis, free_port
from jobs.observe.health import heartbeat_path, liveness, local_liveness, readiness
from tests.support import ROOT, wait_for


def _jobs(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobs", *args], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                          capture_output=True, text=True, timeout=110)


class TestLiveness:
    @pytest.mark.timeout(120)
    def test_a_running_worker_is_live_and_an_absent_one_is_not(
        self, app: Any, worker_factory: Any
    ) -> None:
        """Exit 0 when the node answers the ping; exit 1 for a node that does not exist."""
        worker = worker_factory("optional", name="observe-live", concurrency=1)
        assert all(check.ok for check in liveness(app, worker.nodename, timeout_seconds=5))
        done = _jobs("health", "live", "--node", worker.nodename)
        assert done.returncode == 0, done.stdout + done.stderr
        missing = _jobs("health", "live", "--node", "critical@no-such-host", "--timeout", "1")
        assert missing.returncode == 1, missing.stdout + missing.stderr

    @pytest.mark.timeout(120)
    def test_a_stopped_worker_is_not_live(self, app: Any, worker_factory: Any) -> None:
        """A SIGSTOPped worker (hung process) does not answer: liveness fails."""
        worker = worker_factory("optional", name="observe-hung", concurrency=1)
        worker.sigstop()
        try:
            checks = liveness(app, worker.nodename, timeout_seconds=1)
            assert not checks[0].ok
        finally:
            worker.sigcont()


class TestLocalLiveness:
    @pytest.mark.timeout(180)
    def test_the_heartbeat_follows_the_main_loop_not_the_broker(
        self, worker_factory: Any, tmp_path: Path
    ) -> None:
        """`live --local` exits 0 for a running worker, 1 once its main process is
        SIGSTOPped, 0 after SIGCONT, and stays 0 through a broker outage that makes
        `ready` exit 1 (the worker's broker is a Redis of its own, stopped here)."""
        broker = embedded_redis(free_port(), tmp_path / "broker").start()
        worker = worker_factory("optional", name="observe-beat", concurrency=1, wait=False,
                                env={"BROKER_URL": broker.url})
        node = worker.nodename
        try:
            wait_for(lambda: " ready." in worker.log_tail(), timeout_seconds=90,
                     interval=0.2, message=f"{node} ready")
            alive = _jobs("health", "live", "--local", "--node", node, "--max-age", "5")
            assert alive.returncode == 0, alive.stdout + alive.stderr

            os.kill(worker.pid, signal.SIGSTOP)  # the main process only: its loop halts
            try:
                wait_for(lambda: not local_liveness(node, max_age_seconds=2)[0].ok,
                         timeout_seconds=2 + 60, interval=0.2, message="a stale heartbeat")
                hung = _jobs("health", "live", "--local", "--node", node, "--max-age", "2")
                assert hung.returncode == 1, hung.stdout + hung.stderr
                assert "FAIL heartbeat" in hung.stdout
            finally:
                os.kill(worker.pid, signal.SIGCONT)
            wait_for(lambda: local_liveness(node, max_age_seconds=2)[0].ok,
                     timeout_seconds=60, interval=0.2, message="a fresh heartbeat")

            broker.kill()
            lost_at = time.time()
            ready = subprocess.Popen(  # meanwhile: readiness fails on the broker
                [sys.executable, "-m", "jobs", "health", "ready"], cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT), "BROKER_URL": broker.url},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            # Beats go on past the probe's max age into the outage: the worker is alive.
            wait_for(lambda: heartbeat_path(node).stat().st_mtime > lost_at + 3,
                     timeout_seconds=60, interval=0.2, message="beats during the outage")
            outage = _jobs("health", "live", "--local", "--node", node, "--max-age", "3")
            assert outage.returncode == 0, outage.stdout + outage.stderr + worker.log_tail()
            output, _ = ready.communicate(timeout=110)
            assert ready.returncode == 1, output
            assert "FAIL broker" in output
        finally:
            # Not a warm shutdown: with the broker gone, Celery's event heartbeat may be
            # retrying its publish, and the worker would stop only once the broker is back.
            worker.sigkill()
            broker.kill()


class TestReadiness:
    @pytest.mark.timeout(60)
    def test_ready_when_stores_answer_and_migrations_are_applied(self, app: Any) -> None:
        """Redis, broker and PostgreSQL answer; every migration head is applied."""
        checks = {check.name: check for check in readiness(app)}
        assert set(checks) == {"redis", "broker", "postgres", "migrations"}
        assert all(check.ok for check in checks.values()), checks
        assert _jobs("health", "ready").returncode == 0

    @pytest.mark.timeout(120)
    def test_not_ready_when_redis_is_unreachable(self) -> None:
        """Guard-state Redis on a port nobody listens on: exit 1, the Redis check fails."""
        done = _jobs("health", "ready", env={"REDIS_URL": f"redis://127.0.0.1:{free_port()}/1"})
        assert done.returncode == 1, done.stdout + done.stderr
        assert "FAIL redis" in done.stdout
        assert "ok postgres" in done.stdout

    @pytest.mark.timeout(120)
    def test_not_ready_when_migrations_are_missing(self, services: Any) -> None:
        """An empty database (no migrations applied): PostgreSQL answers, migrations fail."""
        from sqlalchemy import create_engine, make_url, text

        from resilience.stores import _sqlalchemy_url

        url = make_url(_sqlalchemy_url(services.database_url))
        admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
        name = "observe_unmigrated"
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            done = _jobs("health", "ready", env={
                "DATABASE_URL": url.set(database=name).render_as_string(hide_password=False)})
            assert done.returncode == 1, done.stdout + done.stderr
            assert "ok postgres" in done.stdout
            assert "FAIL migrations" in done.stdout
        finally:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


KUBERNETES = ROOT / "deploy" / "kubernetes"


def _kubernetes_objects() -> list[dict[str, Any]]:
    """Every object of the files kustomization.yaml lists, and of secret.example.yaml."""
    import yaml

    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    files = [*kustomization["resources"], "secret.example.yaml"]
    return [document for name in files
            for document in yaml.safe_load_all((KUBERNETES / name).read_text()) if document]


def _jobs_command() -> Any:
    """The `jobs` command line as click sees it, admin groups included (built apart, so
    the shared Typer app is left as it is)."""
    import importlib

    import typer

    from jobs.cli import ADMIN_COMMANDS, cli

    group = typer.main.get_command(cli)
    for name, module in ADMIN_COMMANDS.items():
        group.add_command(typer.main.get_command(importlib.import_module(module).cli), name)
    return group


def _containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return deployment["spec"]["template"]["spec"]["containers"]


class TestKubernetesManifests:
    @pytest.mark.timeout(60)
    def test_every_file_parses_and_objects_are_complete(self) -> None:
        """Every YAML file parses; every object kustomization lists has apiVersion, kind and
        a name; Deployment selectors match their pod labels; URLs and passwords come only
        from the Secret."""
        import yaml

        for path in sorted(KUBERNETES.glob("*.yaml")):
            assert list(yaml.safe_load_all(path.read_text())), path
        objects = _kubernetes_objects()
        kinds = {obj["kind"] for obj in objects}
        assert {"Deployment", "Service", "ConfigMap", "Secret",
                "HorizontalPodAutoscaler"} <= kinds
        for obj in objects:
            assert obj["apiVersion"] and obj["metadata"]["name"], obj
        config = next(obj for obj in objects if obj["kind"] == "ConfigMap")
        assert not [key for key in config["data"]
                    if key.endswith(("_URL", "_URLS")) or "AUTH" in key or "PASSWORD" in key]
        for deployment in (obj for obj in objects if obj["kind"] == "Deployment"):
            template = deployment["spec"]["template"]
            selector = deployment["spec"]["selector"]["matchLabels"]
            assert selector.items() <= template["metadata"]["labels"].items()
            for container in _containers(deployment):
                assert container["resources"]["requests"], deployment["metadata"]["name"]
                sources = container["envFrom"]
                assert {"secretRef": {"name": "jobs-secrets"}} in sources
                assert not [env for env in container.get("env", [])
                            if env["name"].endswith(("_URL", "_URLS", "AUTH"))]

    @pytest.mark.timeout(60)
    def test_commands_and_probes_are_real_jobs_commands(self) -> None:
        """Each container's command and exec probe is a `jobs` command whose options exist
        (`<the same arguments> --help` exits 0 and lists them); workers' liveness is the
        local heartbeat (it runs: exit 1 without a worker, never a usage error) and their
        readiness the worker's recorded check (`jobs health ready --local`); beat runs 2
        replicas."""
        from click.testing import CliRunner

        from jobs.tiers import TIERS

        command, runner = _jobs_command(), CliRunner()
        deployments = {obj["metadata"]["name"]: obj for obj in _kubernetes_objects()
                       if obj["kind"] == "Deployment"}
        for name, deployment in deployments.items():
            for container in _containers(deployment):
                probes = [container[kind]["exec"]["command"] for kind in
                          ("startupProbe", "livenessProbe", "readinessProbe")
                          if "exec" in container.get(kind, {})]
                for argv in [container["command"], *probes]:
                    assert argv[0] == "jobs", (name, argv)
                    shown = runner.invoke(command, [*argv[1:], "--help"])
                    assert shown.exit_code == 0, (name, argv, shown.output)
                    for option in (arg for arg in argv if arg.startswith("--")):
                        assert option in shown.output, (name, argv, option)
        for tier in TIERS:
            worker = _containers(deployments[f"jobs-worker-{tier}"])[0]
            assert worker["command"] == ["jobs", "worker", tier]
            live = worker["livenessProbe"]["exec"]["command"]
            assert live[:5] == ["jobs", "health", "live", "--local", "--tier"] and tier in live
            ready = worker["readinessProbe"]["exec"]["command"]
            assert ready[:5] == ["jobs", "health", "ready", "--local", "--tier"] and tier in ready
            ran = runner.invoke(command, live[1:])
            assert ran.exit_code == 1 and "FAIL heartbeat" in ran.output, ran.output
            ran = runner.invoke(command, ready[1:])
            assert ran.exit_code == 1 and "FAIL readiness" in ran.output, ran.output
        assert deployments["jobs-beat"]["spec"]["replicas"] == 2

    @pytest.mark.timeout(60)
    def test_grace_period_outlasts_the_hard_time_limit_and_hpas_scale_on_depth(self) -> None:
        """Each tier's terminationGracePeriodSeconds exceeds its hard time limit (settings
        default, or the ConfigMap's override), so a warm shutdown lets running tasks end;
        each tier has an HPA on `jobs_queue_depth{tier}` targeting its Deployment."""
        import inspect

        from jobs.observe import metrics
        from jobs.settings import TIER_DEFAULTS
        from jobs.tiers import TIERS

        objects = _kubernetes_objects()
        config = next(obj for obj in objects if obj["kind"] == "ConfigMap")["data"]
        deployments = {obj["metadata"]["name"]: obj for obj in objects
                       if obj["kind"] == "Deployment"}
        hpas = {obj["spec"]["scaleTargetRef"]["name"]: obj for obj in objects
                if obj["kind"] == "HorizontalPodAutoscaler"}
        assert '"jobs_queue_depth"' in inspect.getsource(metrics)
        for tier in TIERS:
            hard = float(config.get(f"JOBS_{tier.upper()}__HARD_TIME_LIMIT_SECONDS",
                                    TIER_DEFAULTS[tier]["hard_time_limit_seconds"]))
            name = f"jobs-worker-{tier}"
            grace = deployments[name]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            assert grace > hard, (tier, grace, hard)
            (metric,) = hpas[name]["spec"]["metrics"]
            assert metric["external"]["metric"]["name"] == "jobs_queue_depth"
            assert metric["external"]["metric"]["selector"]["matchLabels"] == {"tier": tier}
