"""The alert rules (charts/resident/files/alerts.yaml): promtool accepts them, each fires on
its fault and stays quiet on a healthy installation (alert_rules_test.yaml), reads only
series the components export, and links a runbook section that exists."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "charts" / "resident" / "files" / "alerts.yaml"
RULE_TESTS = Path(__file__).with_name("alert_rules_test.yaml")
RUNBOOK = REPO / "docs" / "runbook.md"
RUNBOOK_URL = "https://github.com/resident-dev/resident/blob/main/docs/runbook.md#"

sys.path.insert(0, str(REPO / "tests"))
from metric_catalog import exported, scraped_names  # noqa: E402


def alerts() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


def promtool(*args: str) -> subprocess.CompletedProcess:
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: apt-get install prometheus (scripts/bootstrap installs it)"
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120)


def test_promtool_accepts_the_rules():
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_each_alert_fires_on_its_fault_and_not_on_a_healthy_installation():
    done = promtool("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    cases = [c for t in yaml.safe_load(RULE_TESTS.read_text())["tests"] for c in t["alert_rule_test"]]
    fired = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    names = {a["alert"] for a in alerts()}
    assert fired == names, f"alerts never shown to fire: {names - fired}"
    assert quiet == names, f"alerts never shown to stay quiet: {names - quiet}"


def test_rules_read_only_series_that_exist():
    known = scraped_names(exported()) | {"up"}
    for a in alerts():
        used = set(re.findall(r"\b(resident_[a-z0-9_]+|up)\b", a["expr"]))
        assert used and used <= known, f"{a['alert']} reads unknown series {used - known}"


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the markdown's headings (lower case, spaces to dashes)."""
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"^#{1,6} (.+)$", line)
        if m:
            out.add(re.sub(r"[^a-z0-9 _-]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_every_alert_links_its_runbook_section():
    sections = anchors(RUNBOOK.read_text())
    for a in alerts():
        url = a["annotations"]["runbook_url"]
        assert url.startswith(RUNBOOK_URL), url
        assert url[len(RUNBOOK_URL):] in sections, f"{a['alert']}: no section {url} in docs/runbook.md"
        assert a["labels"]["severity"] in ("warning", "critical")


def test_the_prometheus_rule_is_the_rules_file_unchanged():
    template = (REPO / "charts" / "resident" / "templates" / "monitoring" / "prometheusrule.yaml").read_text()
    assert "spec:\n  {{- .Files.Get \"files/alerts.yaml\" | nindent 2 }}" in template
    assert "{{" not in RULES.read_text().replace("{{ $labels.", "").replace("{{ $value", ""), \
        "the rules file is read raw, not as a template: only alert templates may use braces"


@pytest.mark.parametrize("good, broken", [
    ("expr: max by (namespace, model) (resident_model_phase{phase=\"Degraded\"}) == 1",
     "expr: max by (namespace, model) (resident_model_phase{phase=\"Degraded\"} == 1"),
])
def test_promtool_refuses_a_broken_rule(tmp_path, good, broken):
    """promtool really checks: the same file with one expression broken fails."""
    text = RULES.read_text()
    assert good in text
    bad = tmp_path / "alerts.yaml"
    bad.write_text(text.replace(good, broken))
    assert promtool("check", "rules", str(bad)).returncode != 0
