"""Recompute every summary.json from its raw.json, check that every sample is what its arm
says (succeeded, commit mode of the arm, strategy InPlace, one owner committing on each of
the three nodes, answers from the new revision seen by the clients and none from a third
revision); then redraw switch.png from raw.json.

``python verify.py [FOLDER ...]``: by default every ``*/raw.json`` next to this script."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import benchkit  # noqa: E402
from run import ARMS, NODES, STRATEGY, draw, recompute  # noqa: E402


def problems(raw: dict) -> list[str]:
    """One line per sample that is off its arm; empty when every sample is as its arm says."""
    out = []
    for s in raw["samples"]:
        wrong = []
        if s["result"] != "succeeded":
            wrong.append(f"result {s['result']}")
        if s["commit"] != ARMS[s["arm"]]:
            wrong.append(f"commit {s['commit']} (want {ARMS[s['arm']]})")
        if s["strategy"] != STRATEGY:
            wrong.append(f"strategy {s['strategy']} (want {STRATEGY})")
        if s["commit_nodes"] != NODES:
            wrong.append(f"owners committed on {s['commit_nodes']} (want one on each of {NODES})")
        if not s["new_answers"] > 0:
            wrong.append("no answer from the new revision reached the clients")
        if s["foreign_answers"]:
            wrong.append(f"{s['foreign_answers']} answers from neither revision")
        if wrong:
            out.append(f"{s['arm']} round {s['round']}: " + "; ".join(wrong))
    return out


def main(argv: list[str]) -> int:
    for _, summary in benchkit.verify_folders(HERE, argv, problems, recompute, draw):
        ratio = summary["ratios"]["rolling_over_lockstep_skew"]
        print(f"  rolling / lockstep skew (medians)  {'n/a' if ratio is None else f'{ratio:.1f}x'}")
        for name, t in summary["targets"].items():
            print(f"  {name:<34} {t['value']:.4g} (target <= {t['target']}: {'met' if t['met'] else 'missed'})")
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
