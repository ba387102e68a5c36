"""docs/metrics.md lists exactly the series the components export, each with its type,
labels and component, and the exported names follow Prometheus' conventions."""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from metric_catalog import Series, exported  # noqa: E402



def documented(text: str) -> dict[str, Series]:
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and re.fullmatch(r"`resident_[a-z0-9_]+`", cells[0]):
            name, kind, labels, component = cells[0].strip("`"), *cells[1:4]
            assert name not in rows, f"{name} is listed twice"
            rows[name] = Series(name, kind, tuple(re.findall(r"`([a-z_]+)`", labels)), component.strip())
    return rows


def test_every_exported_series_is_documented_and_nothing_else():
    code = exported()
    docs = documented((REPO / "docs" / "metrics.md").read_text())
    assert sorted(set(code) - set(docs)) == [], "exported but not in docs/metrics.md"
    assert sorted(set(docs) - set(code)) == [], "in docs/metrics.md but not exported"
    for name, series in code.items():
        row = docs[name]
        assert (row.type, row.component) == (series.type, series.component), name
        if series.labels is not None:   # a custom collector's labels show only in samples
            assert set(row.labels) == set(series.labels), name


def test_the_check_sees_a_missing_row():
    text = (REPO / "docs" / "metrics.md").read_text()
    docs = documented("\n".join(ln for ln in text.splitlines() if "`resident_store_leases`" not in ln))
    assert "resident_store_leases" in exported() and "resident_store_leases" not in docs


def test_names_carry_units_and_counters_end_in_total():
    for name, s in exported().items():
        assert re.fullmatch(r"resident_[a-z0-9_]+", name), name
        if s.type == "counter":
            assert name.endswith("_total"), name
        if s.type == "histogram":
            assert name.endswith(("_seconds", "_bytes")), name
        if "duration" in name or "time" in name:
            assert name.endswith(("_seconds", "_seconds_total")), name
        assert not {"pod", "uid", "digest"} & set(s.labels or ()), f"{name} has a high-churn label"
