"""rasd's alerting rules: one file, checked and unit-tested by promtool, shipped as a plain rule file and
as the chart's PrometheusRule (validated against the CRD's schema), over series rasd really exports."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[3]
CHART = REPO / "helm" / "rasd"
RULES = CHART / "files" / "rasd-rules.yaml"
PLAIN_RULES = REPO / "deploy" / "prometheus" / "rasd-rules.yaml"
RULE_TESTS = pathlib.Path(__file__).with_name("rasd-rules.test.yaml")
CRD_SPEC_SCHEMA = pathlib.Path(__file__).with_name("prometheusrule-crd-schema.json")
NAMESPACE = "rasd-system"

# The alerts issue #38 asks for, by what they watch.
EXPECTED_ALERTS = {
    "RasdCircuitBreakerTripped",  # breaker tripped
    "RasdAutomationPaused",  # automation paused
    "RasdEventsLost",  # events lost
    "RasdStoreUnwritable",  # the PostgreSQL store refuses writes (issue #37 item 17)
    "RasdStoreFileLost",  # the SQLite file deleted under the controller (issue #37 item 17)
    "RasdNoLeader",  # no leader
    "RasdLeaderFlapping",  # leader flapping
    "RasdAgentDisconnected",  # agent disconnected
    "RasdAgentSpoolGrowing",  # agent spool growing
    "RasdNodesLost",  # in-service nodes no replica hears (issue #40: the lost-node watch)
    "RasdLostNodeStorm",  # too many at once: the watch holds back
    "RasdDecisionLatencyHigh",  # decision latency high
    "RasdPowerBudgetViolated",  # power budget violated
    "RasdPowerCapsOverBudget",
    "RasdRmaQueueGrowing",  # RMA queue growing
    "RasdSdcSuspects",  # SDC suspects
}


def _rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus; .ci/run installs it)")
    return promtool


def test_the_rules_pass_promtool_check():
    result = subprocess.run([_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_fires_in_its_promtool_unit_test():
    result = subprocess.run(
        [_promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stdout + result.stderr
    fired = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    alerts = {rule["alert"] for rule in _rules()}
    assert alerts == EXPECTED_ALERTS
    assert sorted(alerts - fired) == [], "alerts without a unit test in which they fire"


def test_the_plain_rule_file_is_the_charts_file():
    """One source: deploy/prometheus/rasd-rules.yaml is a link to the file the chart reads."""
    assert PLAIN_RULES.is_symlink()
    assert PLAIN_RULES.resolve() == RULES.resolve()


def _exported_series() -> set[str]:
    """Every series name on the wire, from docs/metrics.md (which test_docs ties to the code)."""
    text = (REPO / "docs" / "metrics.md").read_text()
    names = set()
    for row in re.findall(r"^\| `(rasd_[a-z0-9_]+)` \|(.*)$", text, flags=re.MULTILINE):
        name, rest = row
        kind = rest.split("|")[0].strip()
        names.update(
            {"counter": [f"{name}_total"], "histogram": [f"{name}_bucket", f"{name}_sum", f"{name}_count"]}.get(
                kind, [name]
            )
        )
    return names


def test_the_rules_use_only_series_rasd_exports():
    used = {name for rule in _rules() for name in re.findall(r"\brasd_[a-z0-9_]+", rule["expr"])}
    assert used, "no series found: the scan is broken"
    assert sorted(used - _exported_series()) == []


@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def test_the_prometheus_rule_is_off_by_default(chart):
    assert not any("PrometheusRule" in text for text in chart.render({}, name="rasd", namespace=NAMESPACE).values())


def test_the_prometheus_rule_carries_the_rules_and_validates_against_its_crd(chart):
    values = {"prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}}
    text = chart.render(values, name="rasd", namespace=NAMESPACE)["rasd/templates/prometheusrule.yaml"]
    rule = yaml.safe_load(text)
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    jsonschema.validate(rule["spec"], json.loads(CRD_SPEC_SCHEMA.read_text()))
    # Unchanged by Helm: the templates in the annotations reach Prometheus as written.
    assert rule["spec"] == {"groups": yaml.safe_load(RULES.read_text())["groups"]}
    assert "{{ $labels.node }}" in text


def test_the_crd_schema_refuses_what_the_operator_would_not_load():
    schema = json.loads(CRD_SPEC_SCHEMA.read_text())
    for bad in (
        {"groups": [{"rules": [{"alert": "A", "expr": "up"}]}]},  # a group needs a name
        {"groups": [{"name": "g", "rules": [{"alert": "A"}]}]},  # a rule needs expr
        {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up", "for": "five minutes"}]}]},
        {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up", "annotation": {}}]}]},  # misspelt
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
