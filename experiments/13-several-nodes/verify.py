"""Recompute every summary.json from its raw.json and check that every switch succeeded
by a reload, and that each node-loss sample came back at full strength on other nodes."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import benchkit  # noqa: E402
from run import SWITCH_ARMS, draw, recompute  # noqa: E402

folders = sorted(p.parent for p in HERE.glob("*/raw.json"))
if not folders:
    raise SystemExit("no */raw.json to verify")
for folder in folders:
    raw = json.loads((folder / "raw.json").read_text())
    problems = [f"{s['arm']} round {s['round']}: {s['strategy']} {s['result']}" for s in raw["samples"]
                if s["arm"] in SWITCH_ARMS and (s["strategy"] != "Reload" or s["result"] != "succeeded")]
    problems += [f"{s['arm']} round {s['round']}: {len(s['nodes'] or [])} nodes in lastTransition"
                 for s in raw["samples"]
                 if s["arm"] in SWITCH_ARMS and len(s["nodes"] or []) != (3 if s["arm"] == "spread_switch" else 1)]
    if problems:
        raise SystemExit(f"{folder.name}: samples off their arm:\n" + "\n".join(problems))
    benchkit.verify(folder, recompute, draw)
    summary = json.loads((folder / "summary.json").read_text())
    for name, value in summary["ratios"].items():
        print(f"  {name:<40} {value if value is None else round(value, 2)}")
