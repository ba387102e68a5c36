"""Recompute summary.json from raw.json (benchkit.verify) and check every sample is sound:
each delivery was verified, took the method its arm names, fetched what its arm must."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import benchkit  # noqa: E402
from run import draw, recompute  # noqa: E402

METHOD = {"rebase": "rebase", "reconstruct": "reconstruct", "graph_only": "graph-only"}

raw = json.loads((HERE / "raw.json").read_text())
problems = []
for s in raw["samples"]:
    if s["arm"].startswith("floor_copy"):
        continue  # a reference copy outside the store
    want = next(m for prefix, m in METHOD.items() if s["arm"].startswith(prefix))
    if s["method"] != want or not s["verified"]:
        problems.append(f"{s['arm']} round {s['round']}: method {s['method']}, verified {s['verified']}")
    if s["arm"].startswith(("rebase", "graph_only")) and s["fetched"] != s["changed_bytes"]:
        problems.append(f"{s['arm']} round {s['round']}: fetched {s['fetched']} != changed "
                        f"{s['changed_bytes']}")
    if s["arm"].startswith("reconstruct") and s["fetched"] < raw["config"]["small"]:
        problems.append(f"{s['arm']} round {s['round']}: reconstruct fetched only {s['fetched']}")
if problems:
    raise SystemExit("unsound samples:\n" + "\n".join(problems))
benchkit.verify(HERE, recompute, draw)
summary = json.loads((HERE / "summary.json").read_text())
for name, value in summary["ratios"].items():
    print(f"  {name:<38} {value:8.2f}x")
for name, value in summary["targets"].items():
    print(f"  target {name:<38} {value}")
