"""Recompute summary.json from raw.json (benchkit.verify) and check the samples are whole."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import benchkit  # noqa: E402
from run import recompute  # noqa: E402

raw = json.loads((HERE / "raw.json").read_text())
want = {s["bytes"] for s in raw["samples"]}
if len(want) != 1:
    raise SystemExit(f"arms fetched different byte counts: {sorted(want)}")
benchkit.verify(HERE, recompute)
