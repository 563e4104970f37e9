"""The Grafana dashboard, docs/grafana/hvd_mnist.json: it imports with a Prometheus data-source variable, it has
the panels issue 44 asks for, every PromQL expression in it passes promtool, and against a live 2-rank run's
--metrics-port every metric it names is served (and every served metric has a panel) and every query returns
its series through Debian's real Prometheus, per rank where it draws one line per rank. Grafana itself is not
installable here (Debian does not ship it), so the import is checked on the JSON, not in a Grafana."""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ROOT, TIMEOUT, launcher_env, rank_pid, trainer_command, wait_for
from prometheus_client.parser import text_string_to_metric_families
from test_monitoring import prometheus  # noqa: F401  (the fixture: Prometheus scraping a --metrics-port)

from scripts.peers.local_workers import free_ports

DASHBOARD = ROOT / "docs" / "grafana" / "hvd_mnist.json"
DATA_SOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
METRIC = re.compile(r"\bhvd_mnist_[A-Za-z0-9_:]*")
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")  # Grafana's three spellings
LABEL_VALUES = re.compile(r"label_values\((.+),\s*(\w+)\s*\)", re.S)
# What a panel shows -> the metric it draws, and whether it draws one line per rank.
REQUIRED = {
    "each rank's heartbeat age": ("hvd_mnist_rank_heartbeat_age_seconds", True),
    "each rank's progress age": ("hvd_mnist_rank_seconds_since_progress", True),
    "throughput": ("hvd_mnist_examples_per_second", False),
    "loss": ("hvd_mnist_loss", False),
    "training accuracy": ("hvd_mnist_train_accuracy", False),
    "validation accuracy": ("hvd_mnist_validation_accuracy", False),
    "each rank's compute": ("hvd_mnist_rank_compute_seconds", True),
    "each rank's allreduce wait": ("hvd_mnist_rank_allreduce_wait_seconds", True),
    "checkpoint age": ("hvd_mnist_seconds_since_checkpoint", False),
}
# Each rank's compute over the fastest rank's: the HvdMnistStraggler alert's expression, drawn per rank.
STRAGGLERS = re.compile(r"hvd_mnist_rank_compute_seconds\{[^}]*\}\s*/\s*ignoring\(rank\)\s*group_left\s*"
                        r"min\s+without\s*\(rank\)\s*\(\s*hvd_mnist_rank_compute_seconds\b")


def load(path: Path = DASHBOARD) -> dict:
    return json.loads(path.read_text())


def panels(dashboard: dict) -> list[dict]:
    """Every panel but the rows, those inside a collapsed row too."""
    found = []
    for panel in dashboard["panels"]:
        found += panel.get("panels", []) if panel["type"] == "row" else [panel]
    return found


def targets(dashboard: dict) -> list[tuple[dict, dict]]:
    """(panel, target) for every query of every panel."""
    return [(panel, target) for panel in panels(dashboard) for target in panel.get("targets", [])]


def variable_queries(dashboard: dict) -> list[str]:
    """The queries of the template variables that ask the data source (label_values(...))."""
    return [variable["query"] for variable in dashboard["templating"]["list"] if variable["type"] == "query"]


def expressions(dashboard: dict) -> list[str]:
    return [target["expr"] for _, target in targets(dashboard)] + variable_queries(dashboard)


def promql(query: str, values: dict[str, str]) -> str:
    """The PromQL Grafana sends for `query` with the variables set to `values` (KeyError: a variable the test does
    not know); a variable's label_values(SELECTOR, LABEL) becomes the query that finds those values."""
    expr = VARIABLE.sub(lambda match: values[next(group for group in match.groups() if group)], query)
    if (variable := LABEL_VALUES.fullmatch(expr.strip())) is not None:
        return f"count by ({variable[2]}) ({variable[1]})"
    return expr


def not_served(dashboard: dict, served: set[str]) -> dict[str, list[str]]:
    """{metric the dashboard names but the exporter does not serve: the panels (or variables) naming it}."""
    missing: dict[str, list[str]] = {}
    named = [(panel["title"], target["expr"]) for panel, target in targets(dashboard)]
    named += [(f"variable ${variable['name']}", variable["query"]) for variable in dashboard["templating"]["list"]
              if variable["type"] == "query"]
    for where, expr in named:
        for metric in set(METRIC.findall(expr)) - served:
            missing.setdefault(metric, []).append(where)
    return missing


def missing_panels(dashboard: dict) -> list[str]:
    """What REQUIRED and the straggler panel ask for and no time-series panel shows."""
    series = [(panel, target) for panel, target in targets(dashboard) if panel["type"] == "timeseries"]
    missing = []
    for what, (metric, per_rank) in REQUIRED.items():
        if not any(metric in METRIC.findall(target["expr"]) and (not per_rank or "{{rank}}" in target["legendFormat"])
                   for _, target in series):
            missing.append(what)
    if not any(STRAGGLERS.search(target["expr"]) and "{{rank}}" in target["legendFormat"] for _, target in series):
        missing.append("stragglers")
    return missing


SYNTAX_VALUES = {"job": "hvd_mnist", "instance": "trainer-host:9100", "rank": ".+"}


def promtool_check(dashboard: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    """`promtool check rules` on a rule file with one recording rule per expression: Prometheus's own parser."""
    rules = [{"record": f"dashboard:expression_{i}", "expr": promql(expr, SYNTAX_VALUES)}
             for i, expr in enumerate(expressions(dashboard))]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))  # YAML is a superset of JSON
    return subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)


# --- the JSON alone ---------------------------------------------------------------------------------------------

def test_the_dashboard_imports_with_a_prometheus_data_source_variable():
    """What Grafana's Import (and file provisioning) needs: a schema version of the panel/query era (39), a uid,
    a data-source variable DS_PROMETHEUS that every panel, query and variable uses, so one JSON imports into any
    Grafana whatever its Prometheus data source is called; unique panel ids and a grid that fits 24 columns
    without overlaps; every variable an expression uses defined."""
    dashboard = load()
    assert dashboard["schemaVersion"] == 39 and dashboard["uid"] and dashboard["title"]
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    users = [(panel["title"], panel["datasource"]) for panel in panels(dashboard)]
    users += [(panel["title"], target["datasource"]) for panel, target in targets(dashboard)]
    users += [(f"${name}", variable["datasource"]) for name, variable in variables.items()
              if variable["type"] == "query"]
    assert [who for who, source in users if source != DATA_SOURCE] == []
    every = dashboard["panels"] + [panel for row in dashboard["panels"] for panel in row.get("panels", [])]
    ids = [panel["id"] for panel in every]
    assert len(ids) == len(set(ids)), ids
    cells: dict[tuple[int, int], str] = {}
    for panel in every:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[x, y] = panel["title"]
    used = {next(name for name in match.groups() if name) for expr in expressions(dashboard)
            for match in VARIABLE.finditer(expr)}
    assert used <= set(variables), used - set(variables)


def test_the_dashboard_has_the_panels_issue_44_asks_for():
    """Over time, per rank where it says so: heartbeat and progress ages, throughput, loss, training and
    validation accuracy, compute and allreduce wait, checkpoint age, and each rank's compute against the fastest
    rank's (the stragglers)."""
    assert missing_panels(load()) == []


def test_every_expression_passes_promtool(tmp_path):
    """Prometheus's own parser (Debian's promtool) on every panel's query and every variable's, with the variables
    set as Grafana sets them."""
    proc = promtool_check(load(), tmp_path)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_the_checks_can_fail(tmp_path):
    """A misspelled metric is named with its panel, a syntax error fails promtool, a panel taken away is missed."""
    dashboard = load()
    served = {metric for expr in expressions(dashboard) for metric in METRIC.findall(expr)}
    assert not_served(dashboard, served) == {}
    wrong = copy.deepcopy(dashboard)
    (panel, target), *_ = [(p, t) for p, t in targets(wrong) if "hvd_mnist_loss" in t["expr"]]
    target["expr"] = target["expr"].replace("hvd_mnist_loss", "hvd_mnist_los")
    assert not_served(wrong, served) == {"hvd_mnist_los": [panel["title"]]}
    target["expr"] = target["expr"].replace("hvd_mnist_los", "rate(hvd_mnist_loss")
    assert promtool_check(wrong, tmp_path).returncode != 0
    wrong = copy.deepcopy(dashboard)
    for _, target in targets(wrong):
        if "hvd_mnist_rank_seconds_since_progress" in target["expr"]:
            target["legendFormat"] = "progress age"  # one line, not one per rank
    assert missing_panels(wrong) == ["each rank's progress age"]


# --- against a live run -----------------------------------------------------------------------------------------

def stop(proc: subprocess.Popen, run_dir: Path) -> str:
    """SIGTERM to rank 0: every rank stops after the same step (docs/faults.md); its output."""
    if proc.poll() is None and (pid := rank_pid(str(run_dir), 0)) is not None:
        os.kill(pid, signal.SIGTERM)
    try:
        output, _ = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
        proc.wait()
    return output


@pytest.fixture
def live_run(tmp_path, prometheus) -> Iterator[tuple]:  # noqa: F811  (pytest's fixture, imported above)
    """A 2-rank Gloo run with --metrics-port, evaluating and checkpointing every 100 steps, and Prometheus
    scraping it every second: yields (metrics port, query, the Grafana variables' values). Prometheus starts
    first, as in test_monitoring.py. The run is stopped by SIGTERM to rank 0 afterwards."""
    run_dir = tmp_path / "run"
    port, prometheus_port = free_ports(2)
    query = prometheus(port, prometheus_port)
    command = trainer_command("gloo", 2, "--steps", "1000000", "--log-every", "10", "--eval-every", "100",
                              "--checkpoint-every", "100", "--metrics-port", str(port), "--output-dir", str(run_dir))
    proc = subprocess.Popen(command, env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield port, query, {"job": "hvd_mnist", "instance": f"127.0.0.1:{port}", "rank": ".+"}
        assert proc.poll() is None, "the run ended before the dashboard was checked: give it more --steps"
    finally:
        output = stop(proc, run_dir)
    assert "hvd-mnist: stopped: SIGTERM at step" in output and "Traceback" not in output, output[-3000:]


def served_names(port: int) -> set[str]:
    """The name of every sample rank 0's endpoint serves now (a histogram's _bucket, _sum and _count included)."""
    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {sample.name for family in text_string_to_metric_families(page) for sample in family.samples}


@pytest.mark.slow
def test_every_metric_the_dashboard_names_is_served_and_every_query_has_its_series(live_run):
    """Once the run has reported, evaluated and checkpointed: the endpoint serves every hvd_mnist_ metric the
    dashboard names, the dashboard names every metric it serves, and every panel's and variable's query, with the
    variables set to this run, returns series through Prometheus (both ranks where a panel draws one per rank)."""
    port, query, values = live_run
    wait_for(lambda: len(query("hvd_mnist_rank_compute_seconds")) == 2 and query("hvd_mnist_seconds_since_checkpoint")
             and query("hvd_mnist_validation_accuracy > 0"), TIMEOUT,
             "Prometheus to see each rank's compute, a checkpoint and an evaluation")
    dashboard = load()
    served = served_names(port)
    print(f"served: {sorted(served)}")
    assert not_served(dashboard, served) == {}, "the dashboard names metrics the exporter does not serve"
    named = {metric for expr in expressions(dashboard) for metric in METRIC.findall(expr)}
    undrawn = {name for name in served if name.startswith("hvd_mnist_")} - named
    assert undrawn == set(), "served metrics that no panel draws"
    empty = []
    for where, expr, per_rank in (
            [(panel["title"], target["expr"], "{{rank}}" in target["legendFormat"]) for panel, target in
             targets(dashboard)]
            + [(f"variable ${variable['name']}", variable["query"], variable["name"] == "rank")
               for variable in dashboard["templating"]["list"] if variable["type"] == "query"]):
        result = query(promql(expr, values))
        if not result or (per_rank and set(result) != {"0", "1"}):
            empty.append(f"{where}: {promql(expr, values)} -> {result}")
    assert empty == [], "\n".join(empty)
