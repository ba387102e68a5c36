"""Recompute summary.json from raw.json and check the samples agree with each other:
every arm moved between the same two revisions, in place changed the same rows (graph-only:
only the graph_only arm kept the weights, and neither kept the graph), and every transition
that reached a revision generated the same first token from it."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import benchkit  # noqa: E402
from run import draw, recompute  # noqa: E402


def check_rows(folder: Path, samples: list[dict]) -> None:
    rows = {s["rows_changed"] for s in samples if s["arm"] == "in_place"}
    if len(rows) != 1 or 0 in rows:
        raise SystemExit(f"{folder}: in-place samples changed different row counts: {rows}")
    if any(s["arm"] == "reload_reuse" and s["graph_reused"] is not True for s in samples):
        raise SystemExit(f"{folder}: a reload_reuse sample did not reuse the graph")
    if any(s["arm"] == "reload_cold" and s["graph_reused"] is not False for s in samples):
        raise SystemExit(f"{folder}: a reload_cold sample reused the graph")


def check_graph_only(folder: Path, samples: list[dict]) -> None:
    if any(s["graph_reused"] is not False for s in samples):
        raise SystemExit(f"{folder}: a graph-only sample kept the old graph")
    for arm, kept in (("graph_only", True), ("full_reload", False)):
        if any(s["arm"] == arm and s["weights_reused"] is not kept for s in samples):
            raise SystemExit(f"{folder}: a {arm} sample did not report weightsReused {kept}")


def check(folder: Path) -> None:
    raw = json.loads((folder / "raw.json").read_text())
    samples = raw["samples"]
    if {s["to"] for s in samples} != set(raw["scope"]["digests"].values()):
        raise SystemExit(f"{folder}: samples did not alternate between the two revisions")
    for digest in raw["scope"]["digests"].values():
        tokens = {s["token"] for s in samples if s["to"] == digest}
        if len(tokens) != 1:
            raise SystemExit(f"{folder}: {digest}: arms generated different first tokens {tokens}")
    if raw["scope"]["scenario"] == "graph-only":
        check_graph_only(folder, samples)
    else:
        check_rows(folder, samples)
    if len({s["round"] for s in samples}) < 5:
        raise SystemExit(f"{folder}: fewer than 5 rounds")
    benchkit.verify(folder, recompute, draw)


for folder in (HERE, HERE / "concentrated", HERE / "graph-only"):
    if (folder / "raw.json").exists():
        check(folder)
