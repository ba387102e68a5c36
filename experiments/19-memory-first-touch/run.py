"""What writing into fresh memory costs on this machine: memory just freed and taken
again (``reused``) against memory freed and left idle (``returned``) first.

Experiment 14's lockstep-prepared and preloaded reloads load the next revision into a new
weight arena beside the live one, where a plain reload writes into the arena the live
revision used. On a virtual machine whose balloon driver reports free memory to the host
(``virtio_balloon`` free page reporting; this machine loads it), memory the guest freed
and left idle for a few seconds is given back to the host, and the guest's next first
write to it waits for the host to back it again. This measures that cost without a
cluster: per sample, ``--mib`` of float32 is allocated, written and freed (so the kernel
holds that much free memory), then, for ``returned``, the process waits ``--idle``
seconds; then the same amount is allocated and written once, timed (``first_write``),
and written again (``second_write``: memory already backed). Arms alternate each round.

``python run.py [--rounds 5] [--mib 2048] [--idle 5] [--out DIR]``: raw.json (every sample,
the git commit, load average before and after), summary.json (median and IQR per arm of
``first_write_seconds``, and ``returned`` over ``reused``). ``verify.py`` recomputes it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import benchkit  # noqa: E402

METRIC = "first_write_seconds"
RATIOS = {"returned_over_reused": ("returned", "reused")}


def write_seconds(a: np.ndarray, value: float) -> float:
    t = time.perf_counter()
    a.fill(value)
    return time.perf_counter() - t


def sample(mib: int, idle: float) -> dict:
    n = mib * 2**20 // 4
    held = np.empty(n, dtype=np.float32)
    held.fill(1.0)
    del held                      # freed: the kernel now holds this much free memory
    time.sleep(idle)
    t = time.perf_counter()
    a = np.empty(n, dtype=np.float32)
    a.fill(2.0)
    first = time.perf_counter() - t   # the allocation and the first write
    second = write_seconds(a, 3.0)
    del a
    return {METRIC: first, "second_write_seconds": second, "idle_seconds": idle, "mib": mib}


def recompute(raw: dict) -> dict:
    out = benchkit.summarize(raw["samples"], METRIC, RATIOS)
    out["second_write_seconds"] = {a: benchkit.stats([s["second_write_seconds"] for s in raw["samples"]
                                                       if s["arm"] == a]) for a in ("reused", "returned")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mib", type=int, default=2048, help="as much as a 1 GiB bundle's float32 arena")
    ap.add_argument("--idle", type=float, default=5.0, help="seconds the freed memory idles before `returned`")
    ap.add_argument("--out", type=Path, default=HERE / "2048mib")
    args = ap.parse_args()
    before = benchkit.machine()
    samples = benchkit.run_rounds(args.rounds, {"reused": lambda: sample(args.mib, 0.0),
                                                "returned": lambda: sample(args.mib, args.idle)})
    raw = {**benchkit.provenance(before, benchkit.machine()), "samples": samples,
           "config": {"mib": args.mib, "idle_seconds": args.idle, "rounds": args.rounds}}
    args.out.mkdir(parents=True, exist_ok=True)
    summary = recompute(raw)
    benchkit.write(args.out, raw, summary)
    for arm, s in summary["arms"].items():
        print(f"{arm:9s} first write of {args.mib} MiB: {s['median']:.3f} s (IQR {s['iqr']:.3f})")
    print(f"returned / reused: {summary['ratios']['returned_over_reused']:.1f}x")


if __name__ == "__main__":
    main()
