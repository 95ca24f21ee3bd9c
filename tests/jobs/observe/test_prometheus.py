"""The shipped Prometheus rules: promtool accepts them, their unit tests pass, they name only
exported metrics and real `jobs` commands, and a real Prometheus scraping a live `jobs
metrics` fires JobsBreakerOpen while a breaker is forced open and clears it once closed."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.jobs.observe.promql import (
    PROMETHEUS_SERIES,
    RULES,
    RULES_TEST,
    SCRAPE_CONFIG,
    concrete,
    dashboard_expressions,
    exported_metric_names,
    load_rules,
    metric_names,
    recorded_names,
    rules,
)
from tests.support import ARTIFACTS, wait_for

MISSING = "prometheus/promtool not installed: run ./scripts/ensure-prometheus (make test does)"
needs_prometheus = pytest.mark.skipif(
    not (shutil.which("prometheus") and shutil.which("promtool")), reason=MISSING)

ALERT = "JobsBreakerOpen"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    """Run promtool; its output is kept for the assertion message."""
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60,
                          check=False)


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


# -- the runbook commands ----------------------------------------------------------------
def _jobs_command(words: list[str]) -> tuple[Any, list[str]]:
    """The click command `jobs <words>` resolves to, and the words left after it.

    Groups are found by their `commands` mapping: typer ships its own copy of click.
    """
    import typer

    from jobs.cli import ADMIN_COMMANDS, cli

    first, rest = words[0], words[1:]
    if first in ADMIN_COMMANDS:
        command = typer.main.get_command(importlib.import_module(ADMIN_COMMANDS[first]).cli)
    else:
        command = typer.main.get_command(cli).commands.get(first)  # type: ignore[attr-defined]
        assert command is not None, f"`jobs {first}` does not exist"
    while rest and rest[0] in getattr(command, "commands", {}):
        command, rest = command.commands[rest[0]], rest[1:]
    if getattr(command, "commands", None) and rest and not rest[0].startswith("-"):
        raise AssertionError(f"`jobs {' '.join(words)}`: no subcommand {rest[0]!r}")
    return command, rest


def runbook_commands(text: str) -> list[str]:
    """Every `jobs ...` command quoted in an annotation."""
    return [snippet for snippet in re.findall(r"`([^`]+)`", text) if snippet.startswith("jobs ")]


class TestRules:
    @needs_prometheus
    def test_promtool_accepts_the_rules_and_the_example_config(self) -> None:
        """`promtool check rules` and `promtool check config` pass on the shipped files."""
        checked = promtool("check", "rules", str(RULES))
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert f"SUCCESS: {len(rules())} rules found" in checked.stdout
        config = promtool("check", "config", str(SCRAPE_CONFIG))
        assert config.returncode == 0, config.stdout + config.stderr

    @needs_prometheus
    def test_the_rule_unit_tests_pass(self) -> None:
        """`promtool test rules`: breaker open and dead letters growing fire and clear."""
        tested = {case["alertname"] for test in load_rules(RULES_TEST)["tests"]
                  for case in test.get("alert_rule_test", [])}
        assert {"JobsBreakerOpen", "JobsDeadLettersGrowing"} <= tested
        result = promtool("test", "rules", str(RULES_TEST))
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SUCCESS" in result.stdout

    def test_every_rule_names_only_metrics_the_platform_exports(self) -> None:
        """A rule selects exported series, series recorded here, or Prometheus's own."""
        allowed = exported_metric_names() | recorded_names() | PROMETHEUS_SERIES
        for rule in rules():
            names = metric_names(rule["expr"])
            assert names, f"no metric found in {rule['expr']!r}"
            assert names <= allowed, (rule.get("record") or rule["alert"], names - allowed)

    def test_every_alert_waits_has_a_severity_and_names_a_real_runbook_command(self) -> None:
        """Each alert has `for:`, a severity, a summary, and `jobs` commands that exist."""
        found = alerts()
        assert {"JobsBreakerOpen", "JobsRetryBudgetExhausted", "JobsDeadLettersGrowing",
                "JobsTierNearlyFull", "JobsShedding", "JobsBeatWithoutLeader",
                "JobsOutboxLag"} <= {rule["alert"] for rule in found}
        for rule in found:
            assert re.fullmatch(r"\d+[smh]", rule["for"]), rule
            assert rule["labels"]["severity"] in ("warning", "critical"), rule
            assert rule["annotations"]["summary"], rule
            commands = runbook_commands(rule["annotations"]["description"])
            assert commands, f"{rule['alert']} names no `jobs ...` command"
            for snippet in commands:
                command, rest = _jobs_command(snippet.split()[1:])
                options = {opt for param in command.params for opt in param.opts}
                for word in rest:
                    if word.startswith("--"):
                        assert word in options, f"{snippet!r}: {word} is not an option"


# -- the live test -----------------------------------------------------------------------
class Prometheus:
    """A real `prometheus` server on a free loopback port with a temporary config."""

    def __init__(self, directory: Path, config: dict[str, Any]) -> None:
        from jobs.embedded import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config_path = directory / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        self.log_path = ARTIFACTS / "observe" / f"prometheus-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                ["prometheus", f"--config.file={config_path}",
                 f"--storage.tsdb.path={directory / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
            body = response.read()
        return json.loads(body) if path.startswith("/api/") else body

    def wait_ready(self, timeout_seconds: float = 60) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                self.get("/-/ready")
                return True
            except OSError:
                return False

        wait_for(ready, timeout_seconds=timeout_seconds, interval=0.2, message="prometheus ready")

    def alerts_for(self, breaker: str) -> list[dict[str, Any]]:
        return [alert for alert in self.get("/api/v1/alerts")["data"]["alerts"]
                if alert["labels"].get("alertname") == ALERT
                and alert["labels"].get("breaker") == breaker]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def short_rules(path: Path) -> Path:
    """The shipped rules with every alert's `for:` cut to 2 s (nothing else changes)."""
    shipped = load_rules()
    for group in shipped["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = "2s"
    path.write_text(yaml.safe_dump(shipped, sort_keys=False))
    return path


@needs_prometheus
class TestLivePrometheus:
    @pytest.mark.timeout(240)
    def test_a_forced_open_breaker_fires_the_alert_and_closing_it_clears_it(
        self, stores: Any, start_server: Any, tmp_path: Path,
    ) -> None:
        """Prometheus scrapes `jobs metrics`: forced open → firing; forced closed → gone.

        Every dashboard query also runs on that server without error, so each is valid PromQL
        over the recording rules it loaded.
        """
        from resilience.circuit.backends.redis import RedisBreakerBackend
        from resilience.circuit.breaker import CircuitBreaker
        from resilience.circuit.config import BreakerConfig

        name = "observe-prom-live"  # declared by a task: scrapes read declared names only
        breaker = CircuitBreaker(BreakerConfig(name=name), RedisBreakerBackend(stores.redis))
        breaker.force("forced_open")
        # Prometheus starts first and learns the exporter's address from a file once it
        # answers: its start-up and first target sync overlap the exporter's start-up.
        targets = tmp_path / "targets.json"
        targets.write_text("[]")
        prometheus = Prometheus(tmp_path, {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(short_rules(tmp_path / "rules.yml"))],
            "scrape_configs": [{"job_name": "jobs", "scrape_timeout": "1s",
                                "file_sd_configs": [{"files": [str(targets)],
                                                     "refresh_interval": "1s"}]}],
        })
        try:
            exporter = start_server("metrics")
            pending = tmp_path / "targets.json.new"
            pending.write_text(json.dumps([{"targets": [f"127.0.0.1:{exporter.port}"]}]))
            pending.replace(targets)
            prometheus.wait_ready()

            def firing() -> list[dict[str, Any]]:
                return [a for a in prometheus.alerts_for(name) if a["state"] == "firing"]

            alert = wait_for(firing, timeout_seconds=90, interval=0.5,
                             message=f"{ALERT} firing for {name}")[0]
            assert alert["labels"]["severity"] == "critical"
            assert f"jobs breakers reset {name}" in alert["annotations"]["description"]
            recorded = prometheus.get("/api/v1/query",
                                      query=f'breaker:jobs_breaker_open:max{{breaker="{name}"}}')
            assert [float(s["value"][1]) for s in recorded["data"]["result"]] == [1.0]
            # The two families the rules added to `jobs metrics` arrive through the scrape.
            since = prometheus.get("/api/v1/query",
                                   query=f'jobs_breaker_state_seconds{{breaker="{name}"}}')
            assert [float(s["value"][1]) >= 0 for s in since["data"]["result"]] == [True]
            leader = prometheus.get("/api/v1/query", query="jobs_beat_leader")
            assert [s["value"][1] in ("0", "1") for s in leader["data"]["result"]] == [True]

            for expr in dashboard_expressions():
                answer = prometheus.get("/api/v1/query", query=concrete(expr, breaker=name))
                assert answer["status"] == "success", (expr, answer)

            breaker.force("forced_closed")
            wait_for(lambda: not prometheus.alerts_for(name), timeout_seconds=90, interval=0.5,
                     message=f"{ALERT} cleared for {name}")
        finally:
            prometheus.stop()
            breaker.force("closed")
