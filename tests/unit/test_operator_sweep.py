"""Which models the orphan sweep looks at closely (sweep.differing): a real difference
between a model's records and what its namespace's LISTs showed, not a record or a create
on its way, and the models looked at least recently first; and how long it waits between
sweeps (sweep.pause_after)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from resident_operator.cleanup import ORPHAN_MIN_AGE_SECONDS
from resident_operator.driver import ModelHandle
from resident_operator.settings import settings_from_env
from resident_operator.sweep import differing, pause_after

pytestmark = pytest.mark.unit
NOW = 1_800_000_000.0


def child(uid: str, age: float, **meta) -> dict:
    created = datetime.fromtimestamp(NOW - age, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"metadata": {"uid": uid, "creationTimestamp": created, **meta}}


def handle(name: str, recorded: set[str]) -> ModelHandle:
    h = ModelHandle("team", name, f"uid-{name}")
    h.record(recorded)
    return h


def test_children_as_recorded_do_not_differ_and_a_missing_or_unrecorded_one_does():
    same, missing, extra = handle("same", {"a"}), handle("missing", {"b"}), handle("extra", set())
    listed_from = time.monotonic()
    listed = {"uid-same": [child("a", 60)], "uid-extra": [child("x", ORPHAN_MIN_AGE_SECONDS + 1)]}
    assert differing([same, missing, extra], listed, listed_from, NOW) == [missing, extra]


def test_a_young_unrecorded_child_or_one_going_away_is_no_difference():
    h = handle("m", {"a"})
    listed_from = time.monotonic()
    young = child("new", ORPHAN_MIN_AGE_SECONDS - 2)           # a create whose record is on its way
    going = child("old", 600, deletionTimestamp="2027-01-15T08:00:00Z")
    assert differing([h], {"uid-m": [child("a", 60), young, going]}, listed_from, NOW) == []


def test_records_that_changed_after_the_lists_began_are_compared_by_the_next_sweep():
    h = handle("m", set())
    listed_from = time.monotonic()
    h.record({"created-after-the-list"})                        # the model watch told it later
    assert differing([h], {}, listed_from, NOW) == []
    assert differing([h], {}, time.monotonic(), NOW) == [h]     # the next sweep's LISTs
    recorded_at = h.recorded_at
    h.record({"created-after-the-list"})                        # the same records again: no change
    assert h.recorded_at == recorded_at


def test_the_models_looked_at_least_recently_come_first():
    a, b, c = (handle(n, {"gone"}) for n in "abc")
    a.swept_at, c.swept_at = time.monotonic(), time.monotonic() - 30
    assert differing([a, b, c], {}, time.monotonic(), NOW) == [b, c, a]


def test_a_sweep_that_took_long_waits_so_sweeping_stays_within_its_share():
    settings = settings_from_env({})   # every 60 s, at most 2 % of the time
    assert settings.sweep_share == 0.02
    assert pause_after(settings, 0.3) == 60.0          # a small cluster: the period
    assert pause_after(settings, 3.0) == pytest.approx(150.0)   # 3 s of sweeping: 150 s apart
    assert pause_after(settings_from_env({"RESIDENT_SWEEP_SECONDS": "2", "RESIDENT_SWEEP_SHARE": "0.5"}),
                       0.4) == 2.0
    with pytest.raises(Exception, match="RESIDENT_SWEEP_SHARE"):
        settings_from_env({"RESIDENT_SWEEP_SHARE": "0"})
