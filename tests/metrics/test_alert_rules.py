"""The example Prometheus files load, and every expression names metrics and labels that exist.

promtool is not available here: the rules are parsed as YAML, and each expression's
metric names and label names are checked against what treadle's collectors define.
The YAML that docs/metrics.md shows must be the files' own text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics_core import Metric

from treadle.metrics import DatabaseCollector, WorkerMetrics

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "prometheus"
RULES = EXAMPLES / "treadle-rules.yml"
SCRAPE = EXAMPLES / "prometheus.yml"
PAGE = ROOT / "docs" / "metrics.md"

SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
PROMETHEUS_LABELS = {"job", "instance"}  # added by Prometheus to every scraped sample
SELECTOR = re.compile(r"\b(treadle_\w+)(?:\{([^}]*)\})?")
GROUPING = re.compile(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)")


def defined_metrics() -> dict[str, set[str]]:
    """Every sample name treadle's collectors can produce, with its labels."""
    families: list[Metric] = list(DatabaseCollector._families().values())
    families += list(WorkerMetrics().registry.collect())
    known: dict[str, set[str]] = {}
    for family in families:
        labels = set(getattr(family, "_labelnames", ()) or ())
        for sample in family.samples:
            labels |= set(sample.labels)
        for suffix in SUFFIXES[family.type]:
            known[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return known


def worker_labels() -> dict[str, set[str]]:
    metrics = WorkerMetrics()
    return {
        "treadle_worker_jobs_total": set(metrics.jobs._labelnames),
        "treadle_worker_lease_losses_total": set(metrics.lease_losses._labelnames),
        "treadle_worker_claim_to_start_seconds_bucket": set(metrics.claim_to_start._labelnames) | {"le"},
        "treadle_worker_run_seconds_bucket": set(metrics.run_time._labelnames) | {"le"},
    }


def rules() -> list[dict[str, Any]]:
    loaded = yaml.safe_load(RULES.read_text())
    return [rule for group in loaded["groups"] for rule in group["rules"]]


def test_every_metric_is_known_with_its_labels() -> None:
    known = defined_metrics()
    for name, labels in worker_labels().items():
        assert name in known
        known[name] |= labels
    assert {
        "treadle_jobs",
        "treadle_queue_oldest_waiting_seconds",
        "treadle_live_workers",
        "treadle_worker_jobs_total",
        "treadle_worker_run_seconds_bucket",
    } <= set(known)
    assert known["treadle_jobs"] == {"queue", "state"}
    assert known["treadle_worker_jobs_total"] == {"queue", "name", "outcome"}


@pytest.mark.parametrize("rule", rules(), ids=lambda rule: rule["alert"])
def test_rule_names_metrics_and_labels_that_exist(rule: dict[str, Any]) -> None:
    known = defined_metrics()
    for name, labels in worker_labels().items():
        known[name] |= labels
    assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
    assert rule["alert"].startswith("Treadle") and rule["annotations"]["summary"]
    expr = rule["expr"]
    assert expr.count("(") == expr.count(")"), expr
    selectors = SELECTOR.findall(expr)
    assert selectors, f"{rule['alert']} names no treadle metric"
    used_labels: set[str] = set()
    for name, matchers in selectors:
        assert name in known, f"{rule['alert']}: no metric {name}"
        for matcher in filter(None, (m.strip() for m in matchers.split(","))):
            label = re.split(r"=~|!~|!=|=", matcher)[0].strip()
            assert label in known[name], f"{rule['alert']}: {name} has no label {label}"
        used_labels |= known[name]
    for grouping in GROUPING.findall(expr):
        for label in filter(None, (g.strip() for g in grouping.split(","))):
            assert label in used_labels | PROMETHEUS_LABELS, f"{rule['alert']}: no metric here has label {label}"
    for label in re.findall(r"\$labels\.(\w+)", rule["annotations"]["summary"]):
        assert label in used_labels | PROMETHEUS_LABELS, f"{rule['alert']}: its summary names label {label}"


def test_the_alerts_the_docs_promise() -> None:
    alerts = {rule["alert"] for rule in rules()}
    assert {"TreadleQueueBehind", "TreadleNoLiveWorker", "TreadleFailureRate"} <= alerts


def test_scrape_config_loads_the_rules_and_scrapes_both_endpoints() -> None:
    config = yaml.safe_load(SCRAPE.read_text())
    assert [str(EXAMPLES / name) for name in config["rule_files"]] == [str(RULES)]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"treadle-workers", "treadle-dashboard"}
    assert jobs["treadle-dashboard"]["metrics_path"] == "/metrics"
    for job in jobs.values():
        assert all(":" in target for static in job["static_configs"] for target in static["targets"])


def test_the_page_shows_the_files_as_they_are() -> None:
    shown = re.findall(r"^```yaml (\S+)\n(.*?)^```$", PAGE.read_text(), re.M | re.S)
    assert {path for path, _ in shown} == {
        "examples/prometheus/prometheus.yml",
        "examples/prometheus/treadle-rules.yml",
    }
    for path, text in shown:
        assert text in (ROOT / path).read_text(), f"docs/metrics.md shows {path} other than it is"
