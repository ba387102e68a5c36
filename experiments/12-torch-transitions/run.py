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
import owner_transition  # noqa: E402
from bundle.hf_demo import make_hf_demo, make_hf_revision  # noqa: E402
from owner.backends.torch_lm import TorchBackend  # noqa: E402
from testkit.local_volume import stage_revision  # noqa: E402
from owner.runtime import Owner  # noqa: E402

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
    return owner_transition.summary(raw, RATIOS, ("reload_keep", "reload_cold"))


def draw(raw: dict, folder: Path) -> list[Path]:
    scope = raw["scope"]
    title = f"12: owner transition to first token, torch on the CPU, {scope['mib']} MiB asked"
    return owner_transition.draw(raw, folder, recompute(raw)["arms"], title)


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
    owner.backend.cold = cold
    return owner_transition.sample(owner, digests, strategy, cold, PROMPT)


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
    benchkit.write(HERE, raw, summary, draw)
    print(summary)


if __name__ == "__main__":
    main()
