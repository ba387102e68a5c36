"""In place vs reload keeping the module vs cold load, on the torch backend, to the first token.

One owner runtime (``owner.runtime.Owner`` with the real torch backend on the CPU, in this
process, no HTTP) holds a Llama-style Hugging Face checkpoint of ``--mib`` MiB of BF16
weights (``bundle.hf_demo.make_hf_demo``: random init through transformers, a real BPE
tokenizer). A second revision changes ``--fraction`` of the rows of every projection and the
LM head (``make_hf_revision(kind="rows")``). Every sample is one transition to the *other*
revision (base <-> rows), timed by the owner itself (``timings.totalSeconds``: stage +
apply + verify + one greedy token from the new identity). Arms, alternated per round:

- ``in_place``: strategy InPlace (read + hash the changed chunks, find the changed rows,
  journal, ``copy_`` into the live parameters, read back and verify);
- ``reload_keep``: strategy Reload; the config is unchanged, so the module is kept and
  every tensor of the target (hash-checked) is copied into its parameters;
- ``reload_cold``: strategy Reload with the module dropped first (as for a changed config):
  hash-check, build the meta module and check the checkpoint against it,
  ``from_pretrained``, tokenizer.

After each transition one greedy token is generated for a fixed prompt; verify.py checks
that every sample that reached the same revision generated the same token, whatever the arm.
Usage: ``python experiments/12-torch-transitions/run.py [--mib 1024] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE.parent))

import benchkit  # noqa: E402
from bundle.hf_demo import make_hf_demo, make_hf_revision  # noqa: E402
from owner import api  # noqa: E402
from owner.backends.torch_lm import TorchBackend  # noqa: E402
from owner.local_volume import stage_revision  # noqa: E402
from owner.runtime import Owner  # noqa: E402

METRIC = "to_first_token_seconds"
RATIOS = {"reload_keep_over_in_place": ("reload_keep", "in_place"),
          "reload_cold_over_in_place": ("reload_cold", "in_place"),
          "reload_cold_over_reload_keep": ("reload_cold", "reload_keep")}
PROMPT = "the model revision"


class ColdableTorchBackend(TorchBackend):
    """Benchmark-only: with ``cold`` set, the next reload drops the module as a reload to a
    new config does, instead of keeping it."""

    cold = False

    def reload(self, revision):
        if not self.cold:
            return super().reload(revision)
        self.close()
        return self._load(revision, None)


def recompute(raw: dict) -> dict:
    """The summary to first token, the same without the first-token step, and the ceiling:
    each reload arm over in place's first token alone (an in-place update whose stage,
    apply and verify cost nothing would reach that ratio)."""
    summary = benchkit.summarize(raw["samples"], METRIC, RATIOS)
    derived = [{**s, "transition_seconds": s[METRIC] - s["first_token_seconds"]} for s in raw["samples"]]
    summary["excluding_first_token"] = benchkit.summarize(derived, "transition_seconds", RATIOS)
    token = benchkit.stats([s["first_token_seconds"] for s in raw["samples"] if s["arm"] == "in_place"])
    summary["ceiling_if_in_place_cost_only_its_first_token"] = {
        f"{arm}_over_in_place_first_token": summary["arms"][arm]["median"] / token["median"]
        for arm in ("reload_keep", "reload_cold")}
    return summary


def prepare(work: Path, mib: int, fraction: float) -> tuple[Path, dict]:
    src, vol = work / "src", work / "vol"
    shutil.rmtree(work, ignore_errors=True)
    t0 = time.perf_counter()
    base = make_hf_demo(src / "base", mib * 1024 * 1024, seed=0)
    rows = make_hf_revision(src / "base", src / "rows", "rows", fraction=fraction, seed=1)
    stage_revision(vol, src / "base", make_current=True)
    stage_revision(vol, src / "rows")
    print(f"checkpoints ready in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return vol, {"base": base.digest, "rows": rows.digest}


def transition(owner: Owner, digests: dict, strategy: str, cold: bool) -> dict:
    target = digests["rows"] if owner.current().digest == digests["base"] else digests["base"]
    owner.backend.cold = cold
    t0 = time.perf_counter()
    st = owner.submit(api.TransitionRequest(target=target, path="WholeBundle", strategy=strategy))
    owner.wait_idle(900)
    wall = time.perf_counter() - t0
    if st.result != "succeeded" or st.strategy != strategy:
        raise SystemExit(f"transition failed: {st.model_dump_json()}")
    if strategy == "Reload" and st.graph_reused is cold:
        raise SystemExit(f"module kept {st.graph_reused} but cold={cold}")
    token = owner.backend.generate(PROMPT, 1).tokens[0]
    t = st.timings
    return {METRIC: t.total_seconds, "wall_seconds": wall, "stage_seconds": t.stage_seconds,
            "apply_seconds": t.apply_seconds, "verify_seconds": t.verify_seconds,
            "first_token_seconds": t.first_token_seconds, "to": target, "token": token,
            "rows_changed": st.rows_changed, "bytes_read": st.bytes_read, "graph_reused": st.graph_reused}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=1024, help="BF16 weights size of the checkpoint (MiB)")
    ap.add_argument("--fraction", type=float, default=0.005, help="fraction of rows changed per tensor")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workdir", default="/tmp/resident-bench-12")
    ap.add_argument("--keep", action="store_true", help="keep the generated checkpoints")
    args = ap.parse_args()
    work = Path(args.workdir)
    try:
        vol, digests = prepare(work, args.mib, args.fraction)
        before = benchkit.machine()
        owner = Owner(vol, ColdableTorchBackend())
        owner.start()
        resident = owner.backend.residency
        try:
            arms = {"in_place": lambda: transition(owner, digests, "InPlace", False),
                    "reload_keep": lambda: transition(owner, digests, "Reload", False),
                    "reload_cold": lambda: transition(owner, digests, "Reload", True)}
            samples = benchkit.run_rounds(args.rounds, arms)
        finally:
            owner.close()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    raw = {"scope": {"mib": args.mib, "fraction": args.fraction, "rounds": args.rounds,
                     "digests": digests, "backend": "torch", "device": resident.device, "dtype": resident.dtype,
                     "bytes_resident": resident.bytes, "prompt": PROMPT},
           **benchkit.provenance(before, benchkit.machine()), "samples": samples}
    summary = recompute(raw)
    benchkit.write(HERE, raw, summary)
    print(summary)


if __name__ == "__main__":
    main()
