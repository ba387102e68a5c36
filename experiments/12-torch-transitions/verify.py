"""Recompute summary.json from raw.json and check the samples agree with each other: every
arm moved between the same two revisions, in place changed the same rows each time, the
reload arms kept (or dropped) the module as they say, and every transition that reached a
revision generated the same first token from it."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import benchkit  # noqa: E402
from run import draw, recompute  # noqa: E402

raw = json.loads((HERE / "raw.json").read_text())
samples = raw["samples"]
if {s["to"] for s in samples} != set(raw["scope"]["digests"].values()):
    raise SystemExit("samples did not alternate between the two revisions")
for digest in raw["scope"]["digests"].values():
    tokens = {s["token"] for s in samples if s["to"] == digest}
    if len(tokens) != 1:
        raise SystemExit(f"{digest}: arms generated different first tokens {tokens}")
rows = {s["rows_changed"] for s in samples if s["arm"] == "in_place"}
if len(rows) != 1 or 0 in rows:
    raise SystemExit(f"in-place samples changed different row counts: {rows}")
if any(s["arm"] == "reload_keep" and s["graph_reused"] is not True for s in samples):
    raise SystemExit("a reload_keep sample did not keep the module")
if any(s["arm"] == "reload_cold" and s["graph_reused"] is not False for s in samples):
    raise SystemExit("a reload_cold sample kept the module")
if len({s["round"] for s in samples}) < 5:
    raise SystemExit("fewer than 5 rounds")
benchkit.verify(HERE, recompute, draw)
