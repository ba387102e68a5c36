"""Recompute every summary.json from its raw.json and check that every sample is what its
arm says (every one of the 15 switches succeeded, in place; in the hung arm the operator
reported at least one hung owner, or the hang never reached it); then redraw
transitions.png from raw.json.

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
        wrong = [f"{m}: {r}" for m, r in s["results"].items() if r != "succeeded"]
        if s["strategies"] != ["InPlace"]:
            wrong.append(f"strategies {s['strategies']} (want InPlace)")
        if s["arm"] == "hung" and not s["hung_reported"]:
            wrong.append("no hung owner was reported: the hang never reached the operator")
        if wrong:
            out.append(f"{s['arm']} round {s['round']}: " + "; ".join(wrong))
    return out


def main(argv: list[str]) -> int:
    for _, summary in benchkit.verify_folders(HERE, argv, problems, recompute, draw):
        print("  " + "  ".join(f"slowest {a} {summary['arms'][a]['median']:.3f} s" for a in ARMS))
        t = summary["targets"]["every_model_hung_over_none"]
        print(f"  worst model, hung / none {t['value']:.2f}x (target <= {t['target']}: "
              f"{'met' if t['met'] else 'missed'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
