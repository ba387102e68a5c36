"""What the owner-transition benchmarks (02 on the cpu backend, 12 on torch) share: one
transition between two revisions as a raw sample, and the summary to the first token.

A sample is one transition to the *other* of two revisions (base <-> rows, or base <->
graph) of an in-process owner, timed by the owner itself (``timings.totalSeconds``: stage +
apply + verify + first token), followed by one greedy token for ``prompt`` that verify.py
compares across arms.
"""

from __future__ import annotations

import time
from pathlib import Path

import benchkit
from owner import api

METRIC = "to_first_token_seconds"
# the owner's own steps of a transition, which add up to METRIC (timings.totalSeconds)
STEPS = {"stage": "stage_seconds", "apply": "apply_seconds", "verify": "verify_seconds",
         "first token": "first_token_seconds"}


def sample(owner, digests: dict, strategy: str, cold: bool, prompt: str, path: str = "WholeBundle") -> dict:
    """Run one transition to the revision of ``digests`` (two) that is not live (the caller
    has prepared a cold one) and return its raw sample."""
    target, = (d for d in digests.values() if d != owner.current().digest)
    t0 = time.perf_counter()
    st = owner.submit(api.TransitionRequest(target=target, path=path, strategy=strategy))
    owner.wait_idle(900)
    wall = time.perf_counter() - t0
    if st.result != "succeeded" or st.strategy != strategy:
        raise SystemExit(f"transition failed: {st.model_dump_json()}")
    if strategy == "Reload" and st.graph_reused is cold:
        raise SystemExit(f"graph reuse {st.graph_reused} but cold={cold}")
    token = owner.backend.generate(prompt, 1).tokens[0]
    t = st.timings
    return {METRIC: t.total_seconds, "wall_seconds": wall, "stage_seconds": t.stage_seconds,
            "apply_seconds": t.apply_seconds, "verify_seconds": t.verify_seconds,
            "first_token_seconds": t.first_token_seconds, "to": target, "token": token,
            "rows_changed": st.rows_changed, "bytes_read": st.bytes_read, "graph_reused": st.graph_reused,
            "weights_reused": st.weights_reused}


def summary(raw: dict, ratios: dict[str, tuple[str, str]], reload_arms: tuple[str, ...]) -> dict:
    """The summary to first token, plus the same without the first-token step (which costs
    one full pass over the weights in every arm and so bounds every ratio), plus that bound:
    each reload arm over in place's first token alone, the ratio an in-place update whose
    stage, apply and verify took no time at all would reach."""
    out = benchkit.summarize(raw["samples"], METRIC, ratios)
    derived = [{**s, "transition_seconds": s[METRIC] - s["first_token_seconds"]} for s in raw["samples"]]
    out["excluding_first_token"] = benchkit.summarize(derived, "transition_seconds", ratios)
    token = benchkit.stats([s["first_token_seconds"] for s in raw["samples"] if s["arm"] == "in_place"])
    out["ceiling_if_in_place_cost_only_its_first_token"] = {
        f"{arm}_over_in_place_first_token": out["arms"][arm]["median"] / token["median"] for arm in reload_arms}
    return out


def draw(raw: dict, folder: Path, arms: dict, title: str) -> list[Path]:
    """phases.png: each arm's transition stacked by the owner's steps, from the raw samples;
    ``arms`` is the summary's per-arm statistics of METRIC (its median and IQR beside each bar)."""
    import plots
    order = plots.arms_in_order(raw)
    median = lambda arm, key: benchkit.stats([s[key] for s in raw["samples"] if s["arm"] == arm])["median"]  # noqa: E731
    n = min(arms[a]["n"] for a in order)
    return [plots.phases(
        folder / "phases.png", title, order,
        {step: [median(arm, key) for arm in order] for step, key in STEPS.items()},
        [arms[arm] for arm in order],
        plots.footnote(raw, f"n = {n} per arm, alternating; segments: median of each step; "
                            "dot and whisker: median and IQR to the first token"))]
