"""Recompute every summary.json from its raw.json and check every sample took the path its
arm names. Folders: ``<size>mib/`` (this operator) and ``before-event-driven/`` (the 1 s
tick operator, kept for comparison)."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import benchkit  # noqa: E402
from run import draw, recompute  # noqa: E402

# arm: (path, methods, strategy). With rebase Auto the bridge may reconstruct instead when
# the node's filesystem cannot clone and copying costs more than fetching (docs/bundle.md).
WANT = {
    "graph_only": ("GraphOnly", {"graph-only"}, "Reload"),
    "reconstruct": ("WholeBundle", {"reconstruct"}, "Reload"),
    "rebase": ("WholeBundle", {"rebase", "reconstruct"}, "Reload"),
    "in_place": ("WholeBundle", {"rebase", "reconstruct"}, "InPlace"),
    "reload": ("WholeBundle", {"rebase", "reconstruct"}, "Reload"),
}

folders = sorted(p.parent for p in HERE.glob("*/raw.json"))
if not folders:
    raise SystemExit("no */raw.json to verify")
for folder in folders:
    raw = json.loads((folder / "raw.json").read_text())
    problems = [f"{s['arm']} round {s['round']}: {(s['path'], s['method'], s['strategy'], s['result'])}"
                for s in raw["samples"]
                if s["path"] != WANT[s["arm"]][0] or s["method"] not in WANT[s["arm"]][1]
                or s["strategy"] != WANT[s["arm"]][2] or s["result"] != "succeeded"]
    if problems:
        raise SystemExit(f"{folder.name}: samples that did not take their arm's path:\n" + "\n".join(problems))
    benchkit.verify(folder, recompute, draw)
    for name, value in json.loads((folder / "summary.json").read_text())["ratios"].items():
        print(f"  {name:<30} {value:6.2f}x")
