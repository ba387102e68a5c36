"""Recompute every summary.json from its raw.json and check that each sample switched by
the strategy its arm names, succeeded, and that no answer came from a third revision."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import benchkit  # noqa: E402
from run import ARMS, recompute  # noqa: E402

folders = sorted(p.parent for p in HERE.glob("*/raw.json"))
if not folders:
    raise SystemExit("no */raw.json to verify")
for folder in folders:
    raw = json.loads((folder / "raw.json").read_text())
    problems = [f"{s['arm']} round {s['round']}: {s['strategy']} {s['result']} foreign={s['foreign_revision']}"
                for s in raw["samples"]
                if s["strategy"] != ARMS[s["arm"]][1] or s["result"] != "succeeded" or s["foreign_revision"]]
    if problems:
        raise SystemExit(f"{folder.name}: samples off their arm:\n" + "\n".join(problems))
    benchkit.verify(folder, recompute)
    summary = json.loads((folder / "summary.json").read_text())
    for arm, figures in summary["arms"].items():
        print(f"  {arm:<12} failed {figures['failed_total']}/{figures['requests_total']}, "
              f"resets {figures['resets_total']}, refused {figures.get('refused_total', '-')}")
    for name, value in summary["ratios"].items():
        print(f"  {name:<45} {value:6.2f}x")
