"""Recompute summary.json from raw.json (benchkit.verify) and check every sample is sound:
every cluster round restored the machine, the cached arm found the image the previous arm
built, and a cold build and a cached lookup of the same tree named the same image."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import benchkit  # noqa: E402
from run import recompute  # noqa: E402

raw = json.loads((HERE / "raw.json").read_text())
samples = raw["samples"]
problems = [f"cluster round {s['round']} left {s['leftovers']}" for s in samples
            if s["arm"] == "cluster" and s["leftovers"]]
rounds = {s["round"] for s in samples}
if len(rounds) < 5:
    problems.append(f"only {len(rounds)} rounds; benchmarks need n >= 5")
for s in samples:
    if s["arm"].startswith("image_") and not s["image"].startswith("resident.local/resident:"):
        problems.append(f"{s['arm']} round {s['round']}: unexpected image name {s['image']}")
if problems:
    raise SystemExit("unsound samples:\n" + "\n".join(problems))
benchkit.verify(HERE, recompute)
summary = json.loads((HERE / "summary.json").read_text())
for name, value in summary["ratios"].items():
    print(f"  {name:<28} {value:10.1f}x")
for name, st in summary["cluster"].items():
    print(f"  cluster {name:<28} median {st['median']:.1f}s  IQR {st['iqr']:.1f}s")
