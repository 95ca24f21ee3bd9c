"""The shipped Grafana dashboard: regenerated exactly by deploy/grafana/dashboard.py, laid out
as a row per tier and a row per dependency, and querying only metrics the platform exports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.jobs.observe.promql import (
    DASHBOARD_JSON,
    DASHBOARD_SOURCE,
    PROMETHEUS_SERIES,
    RULES,
    concrete,
    dashboard_expressions,
    dashboard_panels,
    exported_metric_names,
    metric_names,
    recorded_names,
)
from tests.support import ROOT


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_JSON.read_text())


class TestDashboard:
    def test_the_shipped_json_is_what_dashboard_py_generates(self) -> None:
        """`python deploy/grafana/dashboard.py --check`, in a fresh process, finds no change."""
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "random"}
        result = subprocess.run([sys.executable, str(DASHBOARD_SOURCE), "--check"], cwd=ROOT,
                                env=env, capture_output=True, text=True, timeout=120,
                                check=False)
        assert result.returncode == 0, (
            f"{result.stderr}\nregenerate: .venv/bin/python deploy/grafana/dashboard.py")

    def test_every_query_names_a_metric_the_platform_exports(self) -> None:
        """Each panel and variable query selects exported or recorded series only."""
        allowed = exported_metric_names() | recorded_names(RULES) | PROMETHEUS_SERIES
        exprs = dashboard_expressions()
        assert len(exprs) > 30
        for expr in exprs:
            names = metric_names(expr)
            assert names, f"no metric found in {expr!r}"
            assert names <= allowed, (expr, names - allowed)

    def test_a_row_per_tier_and_a_repeated_row_per_dependency(self) -> None:
        """Rows: Overview, one per tier, one repeated over the `breaker` variable."""
        from jobs.tiers import TIERS

        board = dashboard()
        assert board["schemaVersion"] >= 36 and board["uid"] == "jobs-platform"
        rows = [panel for panel in board["panels"] if panel["type"] == "row"]
        assert [row["title"] for row in rows] == [
            "Overview", *(f"Tier {tier}" for tier in TIERS), "Dependency $breaker"]
        assert rows[-1]["repeat"] == "breaker"
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["breaker"]["query"] == "label_values(jobs_breaker_state, breaker)"
        assert variables["datasource"]["type"] == "datasource"

        # Each tier's row queries that tier only; each dependency panel its breaker only.
        current = None
        for panel in board["panels"]:
            if panel["type"] == "row":
                current = panel["title"]
                continue
            exprs = [t["expr"] for t in panel["targets"]]
            assert exprs and panel["datasource"] == {"type": "prometheus",
                                                     "uid": "${datasource}"}
            if current and current.startswith("Tier "):
                tier = current.removeprefix("Tier ")
                assert all(f'tier="{tier}"' in e for e in exprs), (current, exprs)
            if current == "Dependency $breaker":
                assert all("$breaker" in e for e in exprs), exprs

    def test_panels_fit_the_grid_without_overlapping(self) -> None:
        """Unique panel ids; every panel inside the 24 columns; no two panels overlap."""
        panels = dashboard_panels()
        assert len({p["id"] for p in panels}) == len(panels)
        taken: set[tuple[int, int]] = set()
        for panel in panels:
            pos = panel["gridPos"]
            assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
            cells = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                     for y in range(pos["y"], pos["y"] + pos["h"])}
            assert not cells & taken, f"{panel['title']} overlaps another panel"
            taken |= cells

    def test_promtool_parses_every_query(self, tmp_path: Path) -> None:
        """Each query, its variables filled in, is valid PromQL to promtool."""
        if not shutil.which("promtool"):
            pytest.skip("promtool not installed: run ./scripts/ensure-prometheus")
        records = [{"record": f"dashboard:query_{index}:check",
                    "expr": concrete(expr, breaker="payments")}
                   for index, expr in enumerate(dashboard_expressions())]
        path = tmp_path / "queries.yml"
        path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
        result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                                text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
