"""Transition planning: delivery path from bundle.plan, in-place vs reload from owners."""

import pytest

from bundle.manifest import FileEntry, Manifest
from resident_operator.planning import InPlaceImpossible, choose_strategy, plan_transition
from resident_operator.spec import parse_spec


def manifest(graph="1", weights="2"):
    return Manifest(files=(
        FileEntry(path="graph.json", size=10, sha256=graph * 64, role="graph"),
        FileEntry(path="model.safetensors", size=1000, sha256=weights * 64, role="weights"),
    ))


def spec(strategy="Auto", mode="Auto"):
    return parse_spec({"bundle": {"source": "file:///b", "digest": manifest().digest},
                       "transition": {"strategy": strategy}, "delivery": {"mode": mode}})


def test_choose_strategy():
    assert choose_strategy("Auto", False, True) == "InPlace"
    assert choose_strategy("Auto", True, True) == "Reload"
    assert choose_strategy("Auto", False, False) == "Reload"
    assert choose_strategy("Reload", False, True) == "Reload"
    assert choose_strategy("InPlace", False, None) == "InPlace"
    with pytest.raises(InPlaceImpossible, match="graph changed"):
        choose_strategy("InPlace", True, True)
    with pytest.raises(InPlaceImpossible, match="do not support"):
        choose_strategy("InPlace", False, False)


def test_weights_change_is_whole_bundle_in_place():
    p = plan_transition(manifest(weights="3"), manifest(), spec(), owners_in_place=True)
    assert (p.path, p.strategy) == ("WholeBundle", "InPlace")
    assert p.method == "reconstruct" and p.predicted["fallbackReason"]
    assert p.predicted["bytes"]["fetch"] == 1010 and p.predicted["strategy"] == "InPlace"


def test_graph_change_is_graph_only_reload():
    p = plan_transition(manifest(graph="4"), manifest(), spec(), owners_in_place=True)
    assert (p.path, p.method, p.strategy) == ("GraphOnly", "graph-only", "Reload")
    assert p.predicted["bytes"]["fetch"] == 10
    assert "GraphOnly" in p.describe()


def test_in_place_requested_for_a_graph_change_is_refused():
    with pytest.raises(InPlaceImpossible):
        plan_transition(manifest(graph="4"), manifest(), spec("InPlace"), owners_in_place=True)
