"""Recompute every summary.json of this experiment from its raw.json (fails if they differ).

``python verify.py [FOLDER ...]``: by default every ``*/raw.json`` next to this script."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import benchkit  # noqa: E402
from run import recompute  # noqa: E402


def problems(raw: dict) -> list[str]:
    return [f"round {s['round']} {s['arm']}: idled {s['idle_seconds']} s" for s in raw["samples"]
            if (s["arm"] == "reused") != (s["idle_seconds"] == 0)]


if __name__ == "__main__":
    for folder, summary in benchkit.verify_folders(HERE, sys.argv[1:], problems, recompute):
        print(f"  returned / reused: {summary['ratios']['returned_over_reused']:.1f}x")
