"""In place (B2) vs reload (B1) on the cpu backend, each measured to the first token.

One owner runtime (``owner.runtime.Owner`` with the real cpu backend, in this process) holds
a demo model of ``--mib`` MiB of BF16 weights. A second revision changes ``--fraction`` of
the rows of every projection and LM-head tensor (``bundle.cpu_model.make_revision(kind="rows")``).
Every sample is one transition to the *other* revision (base <-> rows), so each arm always
moves the same 0.5 % of rows, and is timed by the owner itself (``timings.totalSeconds``:
stage + apply + verify + first token). Arms, alternated per round by benchkit:

- ``in_place``: strategy InPlace (read + hash the changed chunks, journal, write, verify);
- ``reload_reuse``: strategy Reload; the graph digest is unchanged, so the compiled graph
  is kept (close the old weights, read + hash + widen the new ones);
- ``reload_cold``: strategy Reload after dropping the compiled-graph cache, so the graph
  is compiled again (the KV arenas and tables of every variant), as a reload without reuse.

Scenarios (``--scenario``): ``spread`` (the default, results in this folder) changes
``--fraction`` of the rows of *every* projection and the LM head, so in place must read and
hash one or two 4 MiB chunks per tensor; ``concentrated`` (results in ``concentrated/``)
changes the same number of weight bytes (``--fraction`` of all weights) as one run of rows
in the last layer's down projection and the LM head, as a head-and-last-layer fine-tune
would. ``graph-only`` (results in ``graph-only/``) moves between base and a revision whose
graph file alone differs (``make_revision(kind="graph")``, weights byte-identical), with
path GraphOnly and strategy Reload (what Auto chooses there), in two arms:

- ``graph_only``: the owner keeps its weight arena (``weightsReused``): compile the new
  graph and bind it to the live weights, read no weights file;
- ``full_reload``: the same transition with that reuse switched off (a benchmark-only
  subclass), as the owner did before: close, compile anew (weight arena included), hash
  every chunk and widen every tensor.

After each transition one greedy token is generated; verify.py checks that every sample
that reached the same revision produced the same token, whatever the arm.
Usage: ``python experiments/02-in-place-vs-reload/run.py [--mib 1024] [--rounds 5]
[--scenario spread|concentrated|graph-only]``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE.parent))

import benchkit  # noqa: E402
import owner_transition  # noqa: E402
from bundle.cpu_model import choose_config, make_demo, make_revision, tensor_shapes  # noqa: E402
from owner.backends.cpu import CpuBackend  # noqa: E402
from testkit.local_volume import stage_revision  # noqa: E402
from owner.runtime import Owner  # noqa: E402

GRAPH_ONLY_RATIOS = {"full_reload_over_graph_only": ("full_reload", "graph_only")}
RATIOS = {"reload_reuse_over_in_place": ("reload_reuse", "in_place"),
          "reload_cold_over_in_place": ("reload_cold", "in_place"),
          "reload_cold_over_reload_reuse": ("reload_cold", "reload_reuse")}
VARIANTS = [{"name": "b1-s128", "batch": 1, "seq": 128}, {"name": "b1-s512", "batch": 1, "seq": 512},
            {"name": "b4-s512", "batch": 4, "seq": 512}]  # the demo config's max_seq is 512


class SwitchableCpuBackend(CpuBackend):
    """Benchmark-only: with ``full_reload`` set, a reload to the live weights reads them
    again (close, compile, hash, widen) instead of keeping them."""

    full_reload = False

    def _rebind(self, rev):
        return None if self.full_reload else super()._rebind(rev)


def recompute(raw: dict) -> dict:
    if raw["scope"]["scenario"] == "graph-only":
        out = benchkit.summarize(raw["samples"], owner_transition.METRIC, GRAPH_ONLY_RATIOS)
        derived = [{**s, "transition_seconds": s[owner_transition.METRIC] - s["first_token_seconds"]}
                   for s in raw["samples"]]
        out["excluding_first_token"] = benchkit.summarize(derived, "transition_seconds", GRAPH_ONLY_RATIOS)
        return out
    return owner_transition.summary(raw, RATIOS, ("reload_reuse", "reload_cold"))


def draw(raw: dict, folder: Path) -> list[Path]:
    scope = raw["scope"]
    title = f"02: owner transition to first token, cpu backend, {scope['mib']} MiB ({scope['scenario']})"
    return owner_transition.draw(raw, folder, recompute(raw)["arms"], title)


def concentrated(config: dict, fraction: float) -> tuple[list[str], float]:
    """Tensors and per-tensor fraction that change ``fraction`` of all weight bytes."""
    shapes = dict(tensor_shapes(config))
    names = ["lm_head.weight", f"layers.{config['n_layers'] - 1}.mlp.down_proj.weight"]
    total = sum(math.prod(s) for s in shapes.values())
    return names, min(1.0, fraction * total / sum(math.prod(shapes[n]) for n in names))


def prepare(work: Path, mib: int, fraction: float, scenario: str) -> tuple[Path, dict]:
    src, vol = work / "src", work / "vol"
    shutil.rmtree(work, ignore_errors=True)
    t0 = time.perf_counter()
    base = make_demo(src / "base", mib * 1024 * 1024, seed=0, variants=VARIANTS)
    if scenario == "graph-only":
        other = "graph", make_revision(src / "base", src / "graph", "graph", seed=1)
    else:
        tensors, per_tensor = None, fraction
        if scenario == "concentrated":
            tensors, per_tensor = concentrated(choose_config(mib * 1024 * 1024), fraction)
        other = "rows", make_revision(src / "base", src / "rows", "rows", fraction=per_tensor, seed=1,
                                      tensors=tensors)
    stage_revision(vol, src / "base", make_current=True)
    stage_revision(vol, src / other[0])
    print(f"bundles ready in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return vol, {"base": base.digest, other[0]: other[1].digest}


def transition(owner: Owner, digests: dict, strategy: str, cold: bool) -> dict:
    if cold:
        owner.backend.graph = None  # drop the compiled-graph cache: this reload compiles again
    return owner_transition.sample(owner, digests, strategy, cold, "\n")


def graph_only(owner: Owner, digests: dict, full_reload: bool) -> dict:
    owner.backend.full_reload = full_reload
    return owner_transition.sample(owner, digests, "Reload", True, "\n", path="GraphOnly")


def arms_for(scenario: str, owner: Owner, digests: dict) -> dict:
    if scenario == "graph-only":
        return {"graph_only": lambda: graph_only(owner, digests, False),
                "full_reload": lambda: graph_only(owner, digests, True)}
    return {"in_place": lambda: transition(owner, digests, "InPlace", False),
            "reload_reuse": lambda: transition(owner, digests, "Reload", False),
            "reload_cold": lambda: transition(owner, digests, "Reload", True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=1024, help="weights size of the demo model (MiB)")
    ap.add_argument("--fraction", type=float, default=0.005,
                    help="spread: fraction of rows changed per tensor; concentrated: of all weight bytes")
    ap.add_argument("--scenario", choices=("spread", "concentrated", "graph-only"), default="spread")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workdir", default="/tmp/resident-bench-02")
    ap.add_argument("--keep", action="store_true", help="keep the generated bundles")
    args = ap.parse_args()
    work = Path(args.workdir)
    vol, digests = prepare(work, args.mib, args.fraction, args.scenario)
    load_before, before = os.getloadavg(), benchkit.machine()
    owner = Owner(vol, SwitchableCpuBackend())
    owner.start()
    try:
        samples = benchkit.run_rounds(args.rounds, arms_for(args.scenario, owner, digests))
    finally:
        owner.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    raw = {"scope": {"mib": args.mib, "fraction": args.fraction, "scenario": args.scenario,
                     "rounds": args.rounds, "variants": VARIANTS, "cpus": os.cpu_count(),
                     "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                     "digests": digests, "backend": "cpu"},
           **benchkit.provenance(before, benchkit.machine()), "samples": samples}
    summary = recompute(raw)
    out = HERE if args.scenario == "spread" else HERE / args.scenario
    out.mkdir(exist_ok=True)
    benchkit.write(out, raw, summary, draw)
    print(summary)


if __name__ == "__main__":
    main()
