"""Recompute summary.json from raw.json (benchkit.verify) and check the samples are whole:
every arm fetched the same bytes, chunk by chunk and file by file; in a run with the hf
arm, every hf sample timed the manifest's making apart, and the one-tensor delivery's byte
count agrees with the source's fetched-bytes metric. Prints the targets, met or missed,
and, where the run recorded it, the reader's own CPU as a ratio to the local directory's.

``python verify.py [FOLDER]``: by default this folder."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import benchkit  # noqa: E402
from run import recompute  # noqa: E402

folder = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
raw = json.loads((folder / "raw.json").read_text())
want = {s["bytes"] for s in raw["samples"]} | {s["runs_bytes"] for s in raw["samples"] if "runs_bytes" in s}
if len(want) != 1:
    raise SystemExit(f"arms (or their two reads) fetched different byte counts: {sorted(want)}")
if "delta" in raw:
    for s in raw["samples"]:
        if s["arm"] == "hf" and not (s["make_seconds"] > 0 and s["make_requests"]["requests"] > 0):
            raise SystemExit(f"hf round {s['round']}: the manifest was not made in the sample")
    for d in (raw[k] for k in ("delta", "delta_tensors") if k in raw):
        if d["delivery_fetched_bytes"] != d["delivery_metric_bytes"]:
            raise SystemExit(f"one-tensor delivery ({d.get('chunking', 'fixed')}): the store counted "
                             f"{d['delivery_fetched_bytes']} bytes fetched, the source's metric "
                             f"{d['delivery_metric_bytes']}")
benchkit.verify(folder, recompute)
summary = json.loads((folder / "summary.json").read_text())
for name, t in summary.get("targets", {}).items():
    if "ratio" in t:
        ratio = "n/a" if t["ratio"] is None else f"{t['ratio']:.2f}x"
        print(f"  {name:<20} {ratio:>8} (target <= {t['target']}x: {'met' if t['met'] else 'missed'})")
    else:
        print(f"  {name:<20} {t['bytes']:>10} B (target <= {t['target_bytes']} B: "
              f"{'met' if t['met'] else 'missed'})")
for name in ("s3_over_file", "http_over_file"):   # the reader's own CPU, in runs that record it
    cpu = summary.get("runs_cpu_ratios", {}).get(name)
    if cpu is not None:
        print(f"  {name + ' (reader CPU, file by file)':<44} {cpu:.2f}x")
