"""Monitoring tells the truth: the ServiceMonitor keeps the metrics' own `namespace` label, and the
alert rules pass `promtool test rules` on series shaped the way Prometheus stores them
(tests/ship/prometheusrule.test.yaml: same-named ModelBackfills in two namespaces, a failover)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from .tools import promtool

HERE = Path(__file__).resolve().parent
DEPLOY = HERE.parents[1] / "deploy"


def _rules() -> dict:
    return yaml.safe_load((DEPLOY / "monitoring/prometheusrule.yaml").read_text())


def test_servicemonitor_honors_the_metrics_namespace_label():
    sm = yaml.safe_load((DEPLOY / "monitoring/servicemonitor.yaml").read_text())
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"]["ca"]["secret"]["name"] == "modelbackfill-tls"


@pytest.mark.skipif(promtool() is None, reason="promtool not installed (bash tests/ship/install_tools.sh installs it)")
def test_promtool_rule_unit_tests(tmp_path):
    shutil.copy(HERE / "prometheusrule.test.yaml", tmp_path / "rules.test.yaml")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": _rules()["spec"]["groups"]}, sort_keys=False))
    check = subprocess.run([promtool(), "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    proc = subprocess.run([promtool(), "test", "rules", "rules.test.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


@pytest.mark.skipif(promtool() is None, reason="promtool not installed (bash tests/ship/install_tools.sh installs it)")
def test_promtool_catches_an_alert_that_merges_namespaces(tmp_path):
    """Negative control: the same unit tests fail for a rule that drops the namespace."""
    rules = _rules()["spec"]["groups"]
    for rule in rules[0]["rules"]:
        rule["expr"] = rule["expr"].replace("sum by (namespace, backfill, model)", "sum by (backfill, model)")
    shutil.copy(HERE / "prometheusrule.test.yaml", tmp_path / "rules.test.yaml")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rules}, sort_keys=False))
    proc = subprocess.run([promtool(), "test", "rules", "rules.test.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "FAILED" in proc.stdout + proc.stderr


def test_dashboard_keeps_namespaces_apart():
    dash = json.loads((DEPLOY / "grafana/modelbackfill-dashboard.json").read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    # chained variables: backfills of the chosen namespaces, models of the chosen backfills
    assert 'namespace=~"$namespace"' in variables["backfill"]["definition"]
    assert 'backfill=~"$backfill"' in variables["model"]["definition"]
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            assert 'namespace=~"$namespace"' in expr, expr
            by = re.search(r"sum by \(([^)]*)\)", expr)
            if by and "backfill" in by.group(1):
                # a per-backfill series is per (namespace, backfill): same names in two namespaces stay apart
                assert "namespace" in by.group(1) and "{{namespace}}" in target["legendFormat"], expr


@pytest.mark.skipif(promtool() is None, reason="promtool not installed (bash tests/ship/install_tools.sh installs it)")
def test_dashboard_range_panels_count_a_series_born_in_the_range(tmp_path):
    """A new user's trial: a labelled series appears at its first count (1, not 0), and
    ``increase()`` never counts a series' first sample, so the range panels lost the first
    success, preemption and start of every series (and a whole first Job's running seconds).
    Every dashboard query is parsed by promtool (``$__range`` = 1h), and each ``$__range`` panel
    is evaluated on series shaped as the controller exports them: born at the first count, with
    a failover (the old leader's series goes stale, the new one's is born) in the range."""
    dash = json.loads((DEPLOY / "grafana/modelbackfill-dashboard.json").read_text())
    subst = {"$__range": "1h", "$__rate_interval": "5m", "$namespace": ".*", "$backfill": ".*", "$model": ".*"}

    def concrete(expr: str) -> str:
        for k, v in subst.items():
            expr = expr.replace(k, v)
        return expr

    exprs = {p["title"]: concrete(t["expr"]) for p in dash["panels"] for t in p.get("targets", [])}
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"panel:{i}", "expr": e} for i, e in enumerate(exprs.values())]}]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    check = subprocess.run([promtool(), "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr

    target = 'job="modelbackfill",namespace="team-a",backfill="eval",model="gemma",service="modelbackfill"'
    a, b = 'pod="controller-a",instance="10.0.1.7:8443"', 'pod="controller-b",instance="10.0.1.8:8443"'
    series = [
        # starts: 1 at minute 10 on pod a, 2 at 20; failover at 30; pod b: 1 at 40  -> 3 in the hour
        (f"flexinfer_model_backfill_starts_total{{{target},{a}}}", "_x10 1x9 2x9 stale"),
        (f"flexinfer_model_backfill_starts_total{{{target},{b}}}", "_x40 1x30"),
        # succeeded: 1 at 15 on pod a; pod b: 1 at 45 -> 2
        (f'flexinfer_model_backfill_completions_total{{{target},{a},result="succeeded"}}', "_x15 1x14 stale"),
        (f'flexinfer_model_backfill_completions_total{{{target},{b},result="succeeded"}}', "_x45 1x25"),
        # preempted (pod b, at 50): 1; and its preemption, reason ForegroundDemand: 1
        (f'flexinfer_model_backfill_completions_total{{{target},{b},result="preempted"}}', "_x50 1x20"),
        (f'flexinfer_model_backfill_preemptions_total{{{target},{b},reason="ForegroundDemand"}}', "_x50 1x20"),
        # running seconds: 900 at 15 (a whole first Job), 1200 at 25 on pod a; 300 at 45, 420 at 50 on pod b -> 1620
        (f"flexinfer_model_backfill_useful_running_seconds_total{{{target},{a}}}", "_x15 900x9 1200x4 stale"),
        (f"flexinfer_model_backfill_useful_running_seconds_total{{{target},{b}}}", "_x45 300x4 420x20"),
    ]
    expected = {
        "Starts ($__range)": 3,
        "Succeeded ($__range)": 2,
        "Preemptions ($__range)": 1,
        "Running time ($__range)": 1620,
    }
    tests = [
        {"expr": exprs[title], "eval_time": "60m", "exp_samples": [{"labels": "{}", "value": value}]}
        for title, value in expected.items()
    ]
    table = "Completions by backfill and result (increase over range)"
    tests.append({
        "expr": exprs[table], "eval_time": "60m",
        "exp_samples": [
            {"labels": '{namespace="team-a",backfill="eval",model="gemma",result="succeeded"}', "value": 2},
            {"labels": '{namespace="team-a",backfill="eval",model="gemma",result="preempted"}', "value": 1},
        ],
    })
    unit = {
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series], "promql_expr_test": tests}],
    }
    (tmp_path / "dash.test.yaml").write_text(yaml.safe_dump(unit, sort_keys=False))
    proc = subprocess.run([promtool(), "test", "rules", "dash.test.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
