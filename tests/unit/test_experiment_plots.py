"""Experiments' pictures come from raw.json through the verifier's path, and only from a
raw.json whose summary it reproduces (experiments/benchkit.py, experiments/plots.py)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import struct
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
DELIVERY_TABLE = EXPERIMENTS / "09-e2e-delivery-table"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def delivery_table(monkeypatch):
    """Experiment 09's run.py (its recompute and draw) and benchkit, imported as its verify.py does."""
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    spec = importlib.util.spec_from_file_location("experiment_09_run", DELIVERY_TABLE / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    return run, sys.modules["benchkit"]


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's header, after checking it is one."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", f"{path.name} is not a PNG"
    assert data[-8:-4] == b"IEND", f"{path.name} is cut short"
    return struct.unpack(">II", data[16:24])


def copy_run(folder: Path, to: Path) -> Path:
    to.mkdir()
    for name in ("raw.json", "summary.json"):
        shutil.copy(folder / name, to / name)
    return to


def test_the_verifier_draws_the_committed_run(delivery_table, tmp_path):
    run, benchkit = delivery_table
    folder = copy_run(DELIVERY_TABLE / "1024mib", tmp_path / "1024mib")
    benchkit.verify(folder, run.recompute, run.draw)
    drawn = sorted(p.name for p in folder.glob("*.png"))
    assert drawn == ["bytes.png", "phases.png"]
    for name in drawn:
        width, height = png_size(folder / name)
        assert 400 <= width <= 1400 and 250 <= height <= 800, (name, width, height)
        assert 10_000 < (folder / name).stat().st_size < 150_000, name


def test_a_summary_that_raw_json_does_not_reproduce_fails_and_draws_nothing(delivery_table, tmp_path):
    run, benchkit = delivery_table
    folder = copy_run(DELIVERY_TABLE / "1024mib", tmp_path / "1024mib")
    raw = json.loads((folder / "raw.json").read_text())
    in_place = [s for s in raw["samples"] if s["arm"] == "in_place"]
    for s in in_place:
        s["total_seconds"] *= 3   # in place now as slow as a reload: the stored ratio is wrong
    (folder / "raw.json").write_text(json.dumps(raw))
    with pytest.raises(SystemExit, match="summary.json does not match raw.json"):
        benchkit.verify(folder, run.recompute, run.draw)
    assert not list(folder.glob("*.png"))


def test_the_phases_drawn_add_up_to_each_samples_total(delivery_table):
    """The stacked segments are the parts of totalSeconds, not overlapping timings."""
    run, _ = delivery_table
    raw = json.loads((DELIVERY_TABLE / "1024mib" / "raw.json").read_text())
    for s in raw["samples"]:
        parts = sum(value(s) for value in run.PHASES.values())
        assert parts == pytest.approx(s["total_seconds"], abs=0.002), s["arm"]


def test_verify_folders_refuses_samples_off_their_arm_and_checks_each_folder(delivery_table, tmp_path):
    run, benchkit = delivery_table
    folder = copy_run(DELIVERY_TABLE / "1024mib", tmp_path / "1024mib")
    summaries = benchkit.verify_folders(tmp_path, [], lambda raw: [], run.recompute)
    assert [f for f, _ in summaries] == [folder]
    assert summaries[0][1] == json.loads((folder / "summary.json").read_text())
    with pytest.raises(SystemExit, match="samples off their arm:\nround 0 is wrong"):
        benchkit.verify_folders(tmp_path, [str(folder)], lambda raw: ["round 0 is wrong"], run.recompute)
    with pytest.raises(SystemExit, match="no \\*/raw.json"):
        benchkit.verify_folders(tmp_path / "empty", [], lambda raw: [], run.recompute)
