"""Recompute experiment 10's summaries from their raw.json and check they match: this
folder (the current operator) and ``resync-reads-companions/`` (the run before the safety
resync stopped reading the token Secret and the companions, kept for comparison)."""

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
