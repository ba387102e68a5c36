"""Recompute experiment 10's summary from raw.json and check it matches summary.json."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import benchkit  # noqa: E402
from run import recompute  # noqa: E402

if __name__ == "__main__":
    benchkit.verify(HERE, recompute)
