"""The driver loop on a real asyncio loop: coalescing, no overlap, follow-ups, stop.

The pass is a plain function here (the cluster tests run the real one); ``Stopped`` stands
in for kopf's daemon flag (truthy when set, awaitable ``wait()``).
"""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from resident_operator.context import FollowUp
from resident_operator.driver import ModelHandle, ResyncTurns, drive, next_wait
from resident_operator.source_probes import SourceProbes


class Stopped:
    def __init__(self):
        self.flag = asyncio.Event()

    def __bool__(self):
        return self.flag.is_set()

    def wait(self):
        return self.flag.wait()


def test_next_wait_prefers_again_then_the_earliest_due_within_the_resync():
    assert next_wait(FollowUp(again=True, due=5), 300) == (0.0, False)
    assert next_wait(FollowUp(due=2.5), 300) == (2.5, False)
    wait, resync = next_wait(FollowUp(), 300)
    assert 270 <= wait <= 300 and resync                     # jittered safety resync
    wait, resync = next_wait(FollowUp(due=900), 300)
    assert wait <= 300 and resync
    assert next_wait(FollowUp(), 300, on_probe=True) == (None, False)      # until the probe wakes it
    assert next_wait(FollowUp(due=5), 300, on_probe=True) == (5, False)
    f = FollowUp()
    f.recheck_in(10)
    f.recheck_in(3)
    f.recheck_in(7)
    assert f.due == 3


def test_resync_turns_pass_at_most_the_rate_first_come_first_served():
    turns = ResyncTurns(per_second=4)
    assert turns.take(100.0) == 0.0                          # a free turn: at once
    assert [turns.take(100.0) for _ in range(3)] == [0.25, 0.5, 0.75]   # a burst queues
    assert turns.take(200.0) == 0.0                          # the queue ran empty meanwhile


def test_a_burst_during_a_pass_causes_exactly_one_more_pass_and_passes_never_overlap():
    calls, running, overlaps = [], threading.Lock(), []
    first_pass_may_end = threading.Event()    # the burst lands inside the first pass, however slow the machine

    async def until(n: int, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while len(calls) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def scenario():
        handle, stopped = ModelHandle("ns", "m", "uid"), Stopped()

        def one_pass():
            if not running.acquire(blocking=False):
                overlaps.append(time.monotonic())
                return FollowUp()
            try:
                calls.append(time.monotonic())
                first_pass_may_end.wait(5)
                return FollowUp()
            finally:
                running.release()

        with ThreadPoolExecutor(4) as pool:
            task = asyncio.create_task(drive(handle, stopped, one_pass, pool, None, 300))
            await until(1)                      # the first pass runs (a new driver starts with one)
            for _ in range(50):                 # a burst of events during that pass
                handle.poke("pod")
                await asyncio.sleep(0)
            first_pass_may_end.set()
            await until(2)                      # first pass ends, exactly one more runs
            await asyncio.sleep(0.3)
            assert len(calls) == 2              # settled: nothing more without an event
            handle.poke("delivery")
            await until(3)
            await asyncio.sleep(0.1)
            assert len(calls) == 3
            stopped.flag.set()
            await asyncio.wait_for(task, 2)

    asyncio.run(scenario())
    assert not overlaps


def test_progress_runs_again_at_once_and_a_due_time_wakes_the_model():
    calls = []

    async def scenario():
        handle, stopped = ModelHandle("ns", "m", "uid"), Stopped()
        plan = [FollowUp(again=True), FollowUp(again=True), FollowUp(due=0.3), FollowUp()]

        def one_pass():
            calls.append(time.monotonic())
            return plan[len(calls) - 1] if len(calls) <= len(plan) else FollowUp()

        with ThreadPoolExecutor(1) as pool:
            task = asyncio.create_task(drive(handle, stopped, one_pass, pool, None, 300))
            await asyncio.sleep(1.0)
            stopped.flag.set()
            await asyncio.wait_for(task, 2)

    asyncio.run(scenario())
    assert len(calls) == 4
    assert calls[2] - calls[0] < 0.2            # the steps followed each other at once
    assert 0.25 < calls[3] - calls[2] < 0.6     # then the due time, not the 300 s resync


def test_a_gone_model_ends_the_driver():
    async def scenario():
        with ThreadPoolExecutor(1) as pool:
            await asyncio.wait_for(drive(ModelHandle("ns", "m", "u"), Stopped(), lambda: None,
                                         pool, None, 300), 2)
    asyncio.run(scenario())


def test_a_change_of_the_token_secret_or_a_companion_makes_the_next_pass_read_it_again(monkeypatch):
    from resident_operator import passes

    async def pokes():
        handle = ModelHandle("ns", "m", "uid")
        handle.known.update(token="old")
        handle.poke("pod")
        assert handle.known["token"] == "old"          # other children keep what is known
        handle.poke("secret")
        assert "token" not in handle.known
        handle.known.update(token="t", endpoint="http://m.ns.svc:8000")
        for cause in ("service", "budget", "model"):     # a companion or the spec changed
            handle.poke(cause)
            assert "endpoint" not in handle.known and handle.known["token"] == "t"
            handle.known["endpoint"] = "http://m.ns.svc:8000"
        handle.poke("resync")    # the safety resync trusts the watch for all but the model
        assert handle.known["token"] == "t" and handle.known["endpoint"] == "http://m.ns.svc:8000"
        assert handle.known.pop("read_model") is True
        handle.poke("sweep")                             # a difference the sweep found: read all
        assert "endpoint" not in handle.known and "token" not in handle.known

    asyncio.run(pokes())

    # a pass that ran across a Secret change does not store the token it started with
    known = {"token": "old"}
    model = type("Ctx", (), {"uid": "uid", "token": "", "endpoint": None, "follow_up": FollowUp()})()
    monkeypatch.setattr(passes, "model_context", lambda *a, **kw: model)
    monkeypatch.setattr(passes, "_reconcile", lambda ctx: (known.update(epoch=1), known.pop("token")))
    passes.run_pass(None, None, "ns", "m", "uid", threading.Lock(), known)
    assert model.token == "old" and "token" not in known     # used, but not stored again
    monkeypatch.setattr(passes, "_reconcile", lambda ctx: setattr(ctx, "token", "new"))
    passes.run_pass(None, None, "ns", "m", "uid", threading.Lock(), known)
    assert known["token"] == "new"

    # a spec change that lands after the pass read the model but before it took what is
    # known (its poke forgot the endpoint): the pass checked the companions against the
    # old spec, so it must not store them as checked (the next pass checks them again)
    known = {"endpoint": "http://m.ns.svc:8000", "epoch": 3}

    def read_model_then_spec_changes(*a, **kw):
        known.update(epoch=4)
        known.pop("endpoint")
        return model
    monkeypatch.setattr(passes, "model_context", read_model_then_spec_changes)
    monkeypatch.setattr(passes, "_reconcile", lambda ctx: setattr(ctx, "endpoint", "http://m.ns.svc:8000"))
    passes.run_pass(None, None, "ns", "m", "uid", threading.Lock(), known)
    assert "endpoint" not in known


def test_the_safety_resync_runs_a_pass_that_reuses_what_is_known():
    async def scenario():
        handle, stopped = ModelHandle("ns", "m", "uid"), Stopped()
        seen = []

        def one_pass():
            seen.append(dict(handle.known))
            handle.known.update(token="t", endpoint="e")
            return FollowUp()

        with ThreadPoolExecutor(1) as pool:
            task = asyncio.create_task(drive(handle, stopped, one_pass, pool, None, 0.3))
            await asyncio.sleep(0.1)
            handle.poke("pod")                  # an event: what is known stays
            await asyncio.sleep(0.1)
            assert seen[-1].get("token") == "t"
            await asyncio.sleep(0.5)            # the resync (0.27-0.3 s) runs a pass, and
            stopped.flag.set()                  # trusts the watch and the sweep for the rest
            await asyncio.wait_for(task, 2)
        assert len(seen) >= 3 and seen[2].get("token") == "t" and seen[2].get("endpoint") == "e"

    asyncio.run(scenario())


def test_the_resyncs_of_many_models_together_keep_to_their_turns():
    """Three models due for a resync every 50 ms would pass 60 times a second; with turns
    of 10 a second they pass about 10 times, and an event still wakes a model at once."""
    async def scenario():
        turns, stopped, passes = ResyncTurns(per_second=10), Stopped(), []
        handles = [ModelHandle("ns", f"m{i}", f"uid{i}") for i in range(3)]

        def one_pass_of(h):
            return lambda: passes.append((h.name, time.monotonic())) or FollowUp()

        with ThreadPoolExecutor(3) as pool:
            tasks = [asyncio.create_task(drive(h, stopped, one_pass_of(h), pool, None, 0.05,
                                               resync_turns=turns)) for h in handles]
            await asyncio.sleep(1.0)
            before = len(passes)
            handles[0].poke("pod")              # an event does not wait for a turn
            await asyncio.sleep(0.05)
            woken = [t for name, t in passes[before:] if name == "m0"]
            stopped.flag.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 2)
        resyncs = before - len(handles)         # each model's first pass is not a resync
        assert 5 <= resyncs <= 12, resyncs
        assert woken, "the event waited for a resync turn"

    asyncio.run(scenario())


def test_a_model_on_a_source_probe_has_no_resync_until_the_probe_wakes_it():
    """During an outage the probe of the source wakes its models when it answers; their
    safety resyncs would only find it down (issue 27's outage target)."""
    async def scenario():
        handle, stopped, sources = ModelHandle("ns", "m", "uid"), Stopped(), SourceProbes()
        passes = []

        def one_pass():
            passes.append(time.monotonic())
            follow = FollowUp()
            if len(passes) == 1:
                follow.source_waits.append(("http://127.0.0.1:9/m", "connection refused"))
            return follow

        with ThreadPoolExecutor(1) as pool:
            task = asyncio.create_task(drive(handle, stopped, one_pass, pool, None, 0.05, sources))
            await asyncio.sleep(0.5)            # ten resync periods
            assert len(passes) == 1
            for waiter in sources.answered("http://127.0.0.1:9", time.monotonic()):
                waiter.poke("source")           # the probe found the source answering
            await asyncio.sleep(0.3)            # then the resync runs again
            stopped.flag.set()
            await asyncio.wait_for(task, 2)
        assert len(passes) >= 3

    asyncio.run(scenario())


def test_a_pass_starts_from_the_cached_model_unless_the_safety_resync_woke_it(monkeypatch):
    from resident_operator import passes
    asked = []
    model = type("Ctx", (), {"uid": "uid", "token": "", "endpoint": None, "follow_up": FollowUp()})()

    def model_context(kube, settings, namespace, name, uid=None, fresh=False):
        asked.append(fresh)
        return model
    monkeypatch.setattr(passes, "model_context", model_context)
    monkeypatch.setattr(passes, "_reconcile", lambda ctx: None)
    handle = ModelHandle("ns", "m", "uid")

    async def passes_after(cause):
        handle.poke(cause)
        passes.run_pass(None, None, "ns", "m", "uid", threading.Lock(), handle.known)
    for cause in ("model", "resync", "pod", "sweep"):
        asyncio.run(passes_after(cause))
    assert asked == [False, True, False, False]    # True: read from the API server
