"""A lockstep switch of three replicas on a real node while applications call the model
through its Service (issue 26): every owner prepares, then all commit at one barrier, and
no request fails."""

from __future__ import annotations

import time
from datetime import datetime

from localcluster.traffic import ClosedLoop
from polling import wait_for
from test_serving import ready_endpoints


def test_a_lockstep_switch_of_three_replicas_under_load_fails_no_request(world):
    old, new = world.revs.a, world.fresh_revision("a", "rows", seed=92)
    story = world.ready("e2e-lockstep", old, replicas=3,
                        transition={"commit": "Lockstep", "timeoutSeconds": 300})
    wait_for(lambda: len(ready_endpoints(story)) == 3, timeout=120, what="three ready endpoints", every=0.1)
    wall_minus_monotonic = time.time() - time.monotonic()   # the owners stamp commits by the wall clock
    with ClosedLoop(story.service_address(), "story", clients=6) as load:
        wait_for(lambda: len(load.between(0, time.monotonic())) > 30, timeout=120, what="answers on A", every=0.1)
        last = story.transition({"bundle": {"source": world.server.url, "digest": new}})
        time.sleep(1.0)
    assert (last["commit"], last["strategy"], last["result"]) == ("Lockstep", "InPlace", "succeeded"), last
    commits = [datetime.fromisoformat(c["committedAt"].replace("Z", "+00:00")).timestamp()
               for c in last["commits"]]
    assert len(commits) == 3   # the times are kept to the microsecond, the skew from the owners' floats
    assert abs(last["skewSeconds"] - (max(commits) - min(commits))) <= 3e-6, (last["skewSeconds"], commits)
    answers = load.between(0, time.monotonic())
    assert [a for a in answers if not a.ok] == []
    assert {a.revision for a in answers} == {old, new}
    # no answer from the old revision started after the last owner committed (50 ms for the
    # conversion between the two clocks and the way from the client to the owner)
    last_commit = max(commits) - wall_minus_monotonic
    assert [a for a in answers if a.revision == old and a.start > last_commit + 0.05] == []
    story.delete_and_wait_gone()


def test_a_lockstep_reload_loaded_beside_the_live_revision_turns_no_request_away(world):
    """The owners prepare a reload by loading the target beside the live revision, so the
    commit is a swap that requests wait for: no 503 although every replica reloads at once."""
    old, new = world.revs.a, world.fresh_revision("a", "rows", seed=93)
    story = world.ready("e2e-lockstep-reload", old, replicas=3,
                        transition={"commit": "Lockstep", "timeoutSeconds": 300})
    wait_for(lambda: len(ready_endpoints(story)) == 3, timeout=120, what="three ready endpoints", every=0.1)
    with ClosedLoop(story.service_address(), "story", clients=6) as load:
        wait_for(lambda: len(load.between(0, time.monotonic())) > 30, timeout=120, what="answers on A", every=0.1)
        last = story.transition({"bundle": {"source": world.server.url, "digest": new},
                                 "transition": {"commit": "Lockstep", "strategy": "Reload", "timeoutSeconds": 300}})
        time.sleep(1.0)
    assert (last["commit"], last["strategy"], last["result"]) == ("Lockstep", "Reload", "succeeded"), last
    assert [c.get("loadedBeside") for c in last["commits"]] == [True] * 3, last["commits"]
    answers = load.between(0, time.monotonic())
    assert [a for a in answers if not a.ok] == []
    assert {a.revision for a in answers} == {old, new}
    story.delete_and_wait_gone()
