"""What the shipped rules and dashboard query, and what `jobs metrics` exports.

Metric names are read from PromQL with a small lexer (strings, label matchers, ranges and
grouping label lists removed; a name followed by `(` is a function), and the exported
names from the source of jobs/observe/metrics.py, so a family renamed there, or a typo in a
rule, fails the test that compares them.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.support import ROOT

RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "rules_test.yml"
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DASHBOARD_SOURCE = ROOT / "deploy" / "grafana" / "dashboard.py"
DASHBOARD_JSON = ROOT / "deploy" / "grafana" / "dashboard.json"
METRICS_SOURCE = ROOT / "jobs" / "observe" / "metrics.py"

#: Series Prometheus itself makes: the scrape's health and the alerts' state.
PROMETHEUS_SERIES = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE"})

#: The exposition names of one family, by the kind of object that declares it.
_SUFFIXES = {
    "GaugeMetricFamily": ("",),
    "Gauge": ("",),
    "CounterMetricFamily": ("_total",),
    "Counter": ("_total",),
    "HistogramMetricFamily": ("_bucket", "_sum", "_count"),
    "Histogram": ("_bucket", "_sum", "_count"),
    "SummaryMetricFamily": ("", "_sum", "_count"),
    "Summary": ("", "_sum", "_count"),
}

_KEYWORDS = frozenset({
    "and", "or", "unless", "bool", "by", "without", "on", "ignoring", "group_left",
    "group_right", "offset", "inf", "nan",
})
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", re.IGNORECASE)
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+", re.IGNORECASE)
_NAME = re.compile(r"(?<![0-9.a-zA-Z_:])[a-zA-Z_:][a-zA-Z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric (or recorded series) names a PromQL expression selects."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    names = set()
    for match in _NAME.finditer(text):
        name = match.group()
        if name.lower() in _KEYWORDS or re.match(r"\s*\(", text[match.end():]):
            continue
        names.add(name)
    return names


#: Where the views declare their families (`resilience.views.Family`), which metrics.py exports.
VIEW_SOURCES = tuple((ROOT / "resilience").rglob("view.py"))


def exported_metric_names(source: Path = METRICS_SOURCE) -> set[str]:
    """Every series name `jobs metrics` can expose: the families metrics.py declares and
    those of the views it exports (`Family(name=..., kind=...)`)."""
    names: set[str] = set()
    for path in (source, *VIEW_SOURCES):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            kind = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if kind in _SUFFIXES and node.args and isinstance(node.args[0], ast.Constant):
                family = str(node.args[0].value)
                names.update(family + suffix for suffix in _SUFFIXES[kind])
            if kind == "Family":
                fields = {k.arg: k.value for k in node.keywords
                          if isinstance(k.value, ast.Constant)}
                if "name" in fields:
                    counter = getattr(fields.get("kind"), "value", "gauge") == "counter"
                    names.add(str(fields["name"].value) + ("_total" if counter else ""))
    return names


def load_rules(path: Path = RULES) -> dict[str, Any]:
    """The rule file as YAML."""
    return yaml.safe_load(path.read_text())


def rules(path: Path = RULES) -> list[dict[str, Any]]:
    """Every recording and alerting rule of the file."""
    return [rule for group in load_rules(path)["groups"] for rule in group["rules"]]


def recorded_names(path: Path = RULES) -> set[str]:
    """The series names the recording rules create."""
    return {rule["record"] for rule in rules(path) if "record" in rule}


def dashboard_panels(path: Path = DASHBOARD_JSON) -> list[dict[str, Any]]:
    """Every panel of the dashboard JSON, rows' collapsed panels included."""
    found = []
    for panel in json.loads(path.read_text())["panels"]:
        found.append(panel)
        found.extend(panel.get("panels") or [])
    return found


def dashboard_expressions(path: Path = DASHBOARD_JSON) -> list[str]:
    """Every PromQL query of the dashboard: panel targets and query variables."""
    dashboard = json.loads(path.read_text())
    exprs = [target["expr"] for panel in dashboard_panels(path)
             for target in panel.get("targets") or [] if target.get("expr")]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["query"])
            exprs.append(match.group(1) if match else variable["query"])
    return exprs


def concrete(expr: str, **values: str) -> str:
    """A dashboard query with its Grafana variables replaced, as Prometheus would get it."""
    for name, value in values.items():
        expr = expr.replace(f"${name}", value)
    return expr
