"""Recompute every summary.json from its raw.json, check that every sample switched by its
arm's strategy and commit mode and succeeded (a Lockstep reload loaded beside), that the
pre-staged arms moved no byte inside the switch (prestaged true, fetched 0, stagingSeconds
0) and that the others really delivered (prestaged false, fetched > 0); then redraw
phases.png from raw.json.

``python verify.py [FOLDER ...]``: by default every ``*/raw.json`` next to this script."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import benchkit  # noqa: E402
from run import ARMS, draw, recompute  # noqa: E402


def problems(raw: dict) -> list[str]:
    """One line per sample that is off its arm; empty when every sample is as its arm says."""
    out = []
    for s in raw["samples"]:
        _, _, strategy, prestaged, commit, preload = ARMS[s["arm"]]
        wrong = []
        if preload and s.get("preloaded") is not True:
            wrong.append(f"preloaded {s.get('preloaded')}: the reload did not swap in a preloaded revision")
        if s["strategy"] != strategy:
            wrong.append(f"strategy {s['strategy']} (want {strategy})")
        if s["commit"] != commit:
            wrong.append(f"commit {s['commit']} (want {commit})")
        if commit == "Lockstep" and s["loaded_beside"] != [True]:
            wrong.append(f"loadedBeside {s['loaded_beside']}: the reload was not prepared beside")
        if s["result"] != "succeeded":
            wrong.append(f"result {s['result']}")
        if s["prestaged"] is not prestaged:
            wrong.append(f"prestaged {s['prestaged']} (want {prestaged})")
        if prestaged and (s["fetched"] != 0 or s["staging_seconds"] != 0):
            wrong.append(f"fetched {s['fetched']} B, staging {s['staging_seconds']} s in a pre-staged switch")
        if not prestaged and not s["fetched"] > 0:
            wrong.append(f"fetched {s['fetched']} B: nothing delivered")
        if wrong:
            out.append(f"{s['arm']} round {s['round']}: " + "; ".join(wrong))
    return out


def main(argv: list[str]) -> int:
    for _, summary in benchkit.verify_folders(HERE, argv, problems, recompute, draw):
        for name, t in summary["targets"].items():
            ratio = "n/a" if t["ratio"] is None else f"{t['ratio']:.2f}x"
            total = summary["total_ratios"][name]
            cut = summary["interruption_ratios"][name]
            print(f"  {name:<36} {ratio:>7} (target >= {t['target']}x: {'met' if t['met'] else 'missed'}; "
                  f"of totalSeconds {'n/a' if total is None else f'{total:.2f}x'}; "
                  f"of commit to first token {'n/a' if cut is None else f'{cut:.2f}x'})")
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
