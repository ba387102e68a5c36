"""Recompute every summary.json of the chaos soak from its raw.json, and check that the
record is whole: every planned fault was made or says why not, every switch ended.

``python verify.py [FOLDER ...]``: by default every ``*/raw.json`` next to this script."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE))

import benchkit  # noqa: E402
from run import recompute  # noqa: E402


def problems(raw: dict) -> list[str]:
    out = []
    made = {(f["fault"]["at"], f["fault"]["kind"]) for f in raw["faults"]}
    planned = {(f["at"], f["kind"]) for f in raw["schedule"]}
    if not made <= planned:
        out.append(f"faults made that the schedule does not hold: {sorted(made - planned)}")
    out += [f"switch of {s['model']} at {s['start']} s never ended" for s in raw["switches"] if s["end"] is None]
    return out


def main(argv: list[str]) -> int:
    for _, summary in benchkit.verify_folders(HERE, argv, problems, recompute):
        for name, t in summary["targets"].items():
            print(f"  {name:<22} {t['value']} (target <= {t['target']}: {'met' if t['met'] else 'missed'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
