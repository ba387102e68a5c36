"""csi-sanity, the CSI project's conformance suite, against the real bridge process.

The suite (built from its Go module by :mod:`localcluster.csi_tools`) dials the bridge's
unix socket and runs every spec. The outcome of every spec is compared with
the table in docs/csi-bridge.md ("csi-sanity"), so a spec that starts failing, or one
that newly runs or newly skips, fails this test until the table says why.

Specs that cannot run against a node-only plugin and do not skip themselves are skipped
by name (:data:`SKIP`); the table gives the reason for each skipped spec.
"""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from testkit.bridge import REPO_ROOT, BridgeProcess
from localcluster.csi_tools import csi_sanity

DOC = REPO_ROOT / "docs" / "csi-bridge.md"
# Ginkgo's JUnit names read "[It] <container texts> <spec text>"
JUNIT_PREFIX = "[It] "
# Specs skipped by a --ginkgo.skip regular expression; the others skip themselves on the
# capabilities the bridge does not advertise. Reasons: docs/csi-bridge.md.
SKIP = (
    # every Controller spec: they fail in their setup (ControllerGetCapabilities is
    # UNIMPLEMENTED) instead of skipping when the plugin has no Controller service
    r"\[Controller Server\]",
    # these two get their volume from the Controller's CreateVolume and publish it writable
    r"NodeUnpublishVolume should remove target path$",
    r"NodeGetVolumeStats should fail when volume does not exist on the specified path$",
)


# -- the documented outcome -------------------------------------------------------------
def documented_outcomes(doc: Path = DOC) -> list[tuple[str, str]]:
    """(spec or ``[label]``, outcome) rows of the csi-sanity table in ``doc``."""
    text = doc.read_text()
    section = text.split("## csi-sanity", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[1] in ("passed", "skipped", "pending"):
            rows.append((cells[0].strip("`"), cells[1]))
    return rows


def expected_outcome(spec: str, rows: list[tuple[str, str]]) -> str | None:
    """A row names a spec whole, or a bracketed label (``[Controller Server]``) of many;
    a row naming the spec whole wins."""
    whole = [outcome for name, outcome in rows if name == spec]
    labels = [outcome for name, outcome in rows if name.startswith("[") and name in spec]
    return (whole or labels or [None])[0]


def junit_outcomes(report: Path) -> dict[str, str]:
    """Spec name → passed | skipped | pending | failed, from Ginkgo's JUnit report."""
    outcomes = {}
    for case in ET.parse(report).iter("testcase"):
        name = case.get("name", "")
        if not name.startswith(JUNIT_PREFIX):
            continue    # the suite's own Before/AfterSuite entries
        outcomes[name[len(JUNIT_PREFIX):]] = case.get("status", "")
    return outcomes




def test_the_documented_table_is_well_formed():
    rows = documented_outcomes()
    assert rows and len({name for name, _ in rows}) == len(rows)
    assert any(outcome == "passed" for _, outcome in rows)


def test_csi_sanity_passes_every_spec_a_node_only_plugin_can_run(short_tmp):
    sanity = csi_sanity()
    pods = short_tmp / "kubelet"     # the bridge refuses targets outside its --pods-dir
    (pods / "sanity").mkdir(parents=True)      # csi-sanity makes the mount and staging dirs in it
    bridge = BridgeProcess(short_tmp / "b", pods_dir=pods).start()
    report = short_tmp / "junit.xml"
    try:
        run = subprocess.run([
            str(sanity), f"--csi.endpoint=unix://{bridge.socket}",
            f"--csi.mountdir={pods}/sanity/target", f"--csi.stagingdir={pods}/sanity/staging",
            "--csi.testvolumeaccesstype=mount", *[f"--ginkgo.skip={pattern}" for pattern in SKIP],
            f"--ginkgo.junit-report={report}", "--ginkgo.no-color",
        ], capture_output=True, text=True, timeout=600)
    finally:
        bridge.stop()
    assert report.exists(), f"csi-sanity wrote no report (exit {run.returncode}):\n{run.stdout[-4000:]}"
    outcomes = junit_outcomes(report)
    failed = sorted(spec for spec, status in outcomes.items() if status == "failed")
    assert not failed, f"csi-sanity specs failed:\n" + "\n".join(failed) + "\n" + run.stdout[-6000:]
    rows = documented_outcomes()
    differ = {spec: (status, expected_outcome(spec, rows)) for spec, status in outcomes.items()
              if status != expected_outcome(spec, rows)}
    assert not differ, f"csi-sanity outcomes differ from docs/csi-bridge.md (got, documented): {differ}"
    assert run.returncode == 0, run.stdout[-4000:]
    summary = re.search(r"Ran (\d+) of (\d+) Specs", run.stdout)
    assert summary and int(summary.group(2)) == len(outcomes)
