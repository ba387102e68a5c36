"""Recompute summary.json from raw.json and check every sample took the path its arm names."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import benchkit  # noqa: E402
from run import recompute  # noqa: E402

WANT = {  # arm: (path, method, strategy)
    "graph_only": ("GraphOnly", "graph-only", "Reload"),
    "reconstruct": ("WholeBundle", "reconstruct", "Reload"),
    "rebase": ("WholeBundle", "rebase", "Reload"),
    "in_place": ("WholeBundle", "rebase", "InPlace"),
    "reload": ("WholeBundle", "rebase", "Reload"),
}

raw = json.loads((HERE / "raw.json").read_text())
problems = [f"{s['arm']} round {s['round']}: {(s['path'], s['method'], s['strategy'], s['result'])}"
            for s in raw["samples"]
            if (s["path"], s["method"], s["strategy"]) != WANT[s["arm"]] or s["result"] != "succeeded"]
if problems:
    raise SystemExit("samples that did not take their arm's path:\n" + "\n".join(problems))
benchkit.verify(HERE, recompute)
for name, value in json.loads((HERE / "summary.json").read_text())["ratios"].items():
    print(f"  {name:<30} {value:6.2f}x")
