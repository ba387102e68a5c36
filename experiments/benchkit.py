"""Shared rules for every benchmark in experiments/: alternate arms, keep raw, recompute.

A benchmark runs its arms side by side on the same machine, n >= 5 rounds, alternating
the order each round (ABAB..., then BABA...), and writes every sample to ``raw.json``.
``summarize`` turns raw samples into median and IQR per arm and the ratios between arms;
each folder's ``verify.py`` calls it again on ``raw.json`` and checks that the stored
``summary.json`` matches, so no figure exists that the raw data does not produce. The
pictures follow the same path: ``draw`` (plots.py) runs on the raw data only after its
summary is reproduced, and writes the PNGs next to it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable


def sibling(folder: str):
    """Another experiment's run.py as a module (a folder name such as ``09-e2e-delivery-table``
    is no package name), for the helpers it shares; loaded as ``exp<folder>``."""
    here = Path(__file__).resolve().parent
    spec = importlib.util.spec_from_file_location("exp" + folder.replace("-", "_"), here / folder / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def order(round_index: int, arms: list[str]) -> list[str]:
    """Arm order for one round: forward on even rounds, reversed on odd ones."""
    return arms if round_index % 2 == 0 else list(reversed(arms))


def run_rounds(n: int, arms: dict[str, Callable[[], dict]]) -> list[dict]:
    """Run every arm once per round in alternating order; each call returns a sample dict."""
    if n < 5:
        raise ValueError("benchmarks need n >= 5 rounds")
    samples = []
    for i in range(n):
        for name in order(i, list(arms)):
            sample = arms[name]()
            samples.append({"round": i, "arm": name, **sample})
    return samples


def stats(values: list[float]) -> dict:
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"n": len(values), "median": median, "q1": q1, "q3": q3, "iqr": q3 - q1}


def summarize(samples: list[dict], metric: str, ratios: dict[str, tuple[str, str]]) -> dict:
    """Median/IQR of ``metric`` per arm, and median ratios ``name: (numerator, denominator)``
    (None where the denominator's median is zero: a ratio to nothing is no figure)."""
    arms = sorted({s["arm"] for s in samples})
    per_arm = {a: stats([s[metric] for s in samples if s["arm"] == a]) for a in arms}
    out = {"metric": metric, "arms": per_arm, "ratios": {}}
    for name, (num, den) in ratios.items():
        den_median = per_arm[den]["median"]
        out["ratios"][name] = per_arm[num]["median"] / den_median if den_median else None
    return out


def wait_until(what: str, probe: Callable[[], object], timeout: float, every: float):
    """Poll ``probe`` every ``every`` seconds until it returns something truthy; return it.
    The polling interval bounds how precisely a benchmark times what it waits for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(every)
    raise TimeoutError(f"not {what} after {timeout:.0f}s")


def machine() -> dict:
    """The state of the checkout and the machine now: git commit (and whether the tree had
    changes), load average, cores, time. Take one before the arms run, one after."""
    repo = Path(__file__).resolve().parent.parent
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], capture_output=True,  # noqa: E731
                                    text=True).stdout.strip()
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain")),
            "loadavg": list(os.getloadavg()), "cpus": os.cpu_count(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def provenance(before: dict, after: dict) -> dict:
    """What a raw.json records of where it ran: the commit it measured (the one checked out
    when it started; ``commit_end`` too if the checkout moved during the run), the cores,
    and the load average before and after."""
    out = {"commit": before["commit"], "dirty": before["dirty"], "cpus": before["cpus"],
           "loadavg": {"before": before["loadavg"], "after": after["loadavg"]},
           "started": before["time"], "ended": after["time"]}
    if after["commit"] != before["commit"]:
        out["commit_end"] = after["commit"]
    return out


Draw = Callable[[dict, Path], list[Path]]


def write(folder: Path, raw: dict, summary: dict, draw: Draw | None = None) -> None:
    """Write raw.json and summary.json, and the PNGs ``draw`` makes from the raw data."""
    (folder / "raw.json").write_text(json.dumps(raw, indent=1, sort_keys=True) + "\n")
    (folder / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    if draw:
        draw(raw, folder)


def verify(folder: Path, recompute: Callable[[dict], dict], draw: Draw | None = None) -> None:
    """Recompute the summary from raw.json and fail loudly if summary.json differs; then
    redraw the folder's PNGs from the same raw data."""
    raw = json.loads((folder / "raw.json").read_text())
    stored = json.loads((folder / "summary.json").read_text())
    fresh = json.loads(json.dumps(recompute(raw), sort_keys=True))
    if fresh != stored:
        raise SystemExit(f"{folder}: summary.json does not match raw.json\nstored={stored}\nfresh={fresh}")
    print(f"{folder.name}: summary reproduced from {folder / 'raw.json'}")
    for png in draw(raw, folder) if draw else []:
        print(f"{folder.name}: drew {png.name}")


def verify_folders(here: Path, argv: list[str], problems: Callable[[dict], list[str]],
                   recompute: Callable[[dict], dict], draw: Draw | None = None) -> list[tuple[Path, dict]]:
    """A verify.py's work for each folder named in ``argv`` (by default every ``*/raw.json``
    beside ``here``): every sample as its arm says (``problems`` lists those that are not),
    then :func:`verify`. Returns each folder with its summary, for the caller to print."""
    folders = [Path(a) for a in argv] or sorted(p.parent for p in here.glob("*/raw.json"))
    if not folders:
        raise SystemExit("no */raw.json to verify")
    out = []
    for folder in folders:
        found = problems(json.loads((folder / "raw.json").read_text()))
        if found:
            raise SystemExit(f"{folder.name}: samples off their arm:\n" + "\n".join(found))
        verify(folder, recompute, draw)
        out.append((folder, json.loads((folder / "summary.json").read_text())))
    return out
