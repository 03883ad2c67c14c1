"""The shipped alert rules and Grafana dashboard: valid for promtool, unit-tested, and built on
metric names that /metrics really exposes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from django.test import Client

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "ledger.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None,
                                    reason="promtool (Debian package prometheus) not installed")


@needs_promtool
def test_promtool_accepts_the_rules() -> None:
    result = subprocess.run([str(PROMTOOL), "check", "rules", str(RULES)], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 7 rules found" in result.stdout


@needs_promtool
def test_the_rules_unit_tests_pass() -> None:
    result = subprocess.run([str(PROMTOOL), "test", "rules", str(RULE_TESTS)],
                            capture_output=True, text=True, check=False, cwd=RULE_TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def exposed_names(db: None) -> set[str]:
    body = Client().get("/metrics").content.decode()
    names = set(re.findall(r"^# TYPE (\w+) ", body, re.M))
    # Counters and histograms are queried by their series names.
    return names | {f"{n}_total" for n in names} | {f"{n}_bucket" for n in names}


def referenced(text: str) -> set[str]:
    return set(re.findall(r"\bledger_[a-z_]+\b", text))


def test_every_metric_in_the_rules_and_the_dashboard_is_exposed(db: None) -> None:
    names = exposed_names(db)
    rules = referenced(RULES.read_text())
    dashboard = referenced(json.dumps([t["expr"] for p in json.loads(DASHBOARD.read_text())
                                       ["panels"] for t in p["targets"]]))
    assert {"ledger_in_flight_past_lease", "ledger_unknown_past_sla",
            "ledger_cases_review_overdue", "ledger_keys_near_retention",
            "ledger_sweep_last_finished_timestamp_seconds",
            "ledger_provider_send_outcomes_total"} <= rules
    assert rules - names == set()
    assert dashboard - names == set()


def test_metrics_carry_the_sweep_heartbeats(db: None) -> None:
    from reconciliation.tasks import sweep_leases

    sweep_leases.apply()
    body = Client().get("/metrics").content.decode()
    assert re.search(r'^ledger_sweep_last_finished_timestamp_seconds\{sweep="leases"\} \d', body,
                     re.M)
