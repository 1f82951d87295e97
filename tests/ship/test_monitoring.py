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
