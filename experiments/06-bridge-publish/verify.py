"""Recompute summary.json from raw.json and check what the arms claim about content:
a cold publish stores the bundle once, warm and confirm publishes store nothing new."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import benchkit  # noqa: E402
from run import recompute  # noqa: E402

raw = json.loads((HERE / "raw.json").read_text())
for s in raw["samples"]:
    if s["arm"] == "cold" and s["store_bytes_added"] < raw["bundle_bytes"]:
        raise SystemExit(f"cold sample stored {s['store_bytes_added']} < bundle {raw['bundle_bytes']}")
    if s["arm"] in ("warm", "confirm") and s["store_bytes_added"] != 0:
        raise SystemExit(f"{s['arm']} sample stored {s['store_bytes_added']} new bytes; expected 0")
benchkit.verify(HERE, recompute)
