"""Recompute experiment 10's summaries from their raw.json and check they match: this
folder and every folder of a later run in it that holds a raw.json (a ``profile.json``
is a diagnosis, with no summary to check)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import benchkit  # noqa: E402
from run import draw, recompute  # noqa: E402

if __name__ == "__main__":
    for folder in [HERE, *sorted(p.parent for p in HERE.glob("*/raw.json"))]:
        benchkit.verify(folder, recompute, draw)
