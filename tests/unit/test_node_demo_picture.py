"""The demo's picture of its switches: drawn from each transition's status durations."""

from __future__ import annotations

import pytest

from localcluster.demo_picture import draw_transitions, segments


def switch(staging: float, owner: float, total: float) -> dict:
    return {"durations": {"stagingSeconds": staging, "ownerSeconds": owner,
                         "overheadSeconds": round(total - staging - owner, 3), "totalSeconds": total}}


SWITCHES = [("A->B graph", switch(0.05, 0.2, 0.41)), ("B->C rows", switch(0.3, 0.6, 1.2)),
            ("C->D rebase", switch(0.9, 1.1, 2.5))]


def test_the_phases_are_the_status_durations_and_add_up_to_each_total():
    phases = segments(SWITCHES)
    assert list(phases) == ["bridge: staging", "owner: apply to first token", "operator"]
    assert phases["bridge: staging"] == [0.05, 0.3, 0.9]
    for i, (_, last) in enumerate(SWITCHES):
        assert sum(values[i] for values in phases.values()) == pytest.approx(last["durations"]["totalSeconds"])


def test_a_png_is_drawn_and_a_switch_without_durations_draws_as_zero(tmp_path):
    path = draw_transitions(SWITCHES + [("D->E failed", {})], tmp_path / "t.png", "demo/tiny-lm")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[-8:-4] == b"IEND"
    assert 5_000 < len(data) < 150_000
    assert segments([("x", {})])["operator"] == [0.0]
