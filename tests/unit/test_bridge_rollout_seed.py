"""A node of a rollout waits for the seed (csi_bridge/peering.py): a seed that finishes
between two looks is a holder, not a seed that stopped, nor a reason for the node to lead a
rollout of its own. CI runs saw a node fetch from the origin as the seed finished (stop 43:
while waiting; stop 50: as the node began)."""

from types import SimpleNamespace

from csi_bridge import peering
from csi_bridge.peering import Peering


def waiting_node(events: list[str]) -> Peering:
    """A Peering of node-2 whose seed, node-0, finishes staging while node-2 asks its peers."""
    node = object.__new__(Peering)
    node.node_id = "node-2"
    state = {"staged": False}
    node.others = lambda: [("node-0", "10.0.0.1:9820"), ("node-1", "10.0.0.2:9820")]

    def rollout_seed(digest):
        events.append("seed?")
        return None if state["staged"] else "node-0"

    def holders(digest, others=None, say_why=False):
        events.append("holders?")
        if state["staged"]:
            return [SimpleNamespace(node="node-0")]
        state["staged"] = True   # the seed's delivery turns Staged just after this answer
        return []
    node.rollout_seed, node.holders = rollout_seed, holders
    return node


def test_a_seed_that_finishes_between_two_looks_is_taken_as_a_holder(monkeypatch):
    monkeypatch.setattr(peering, "SEED_POLL_SECONDS", 0.0)
    events = []
    assert [h.node for h in waiting_node(events).await_seed("node-0", "sha256:x")] == ["node-0"]
    assert events == ["seed?", "holders?", "seed?", "holders?"]


def test_a_seed_that_finishes_as_a_node_begins_is_taken_as_a_holder(monkeypatch):
    """The CI run of stop 50 saw two nodes of a three-node rollout fetch from the origin:
    node-1 asked who holds the revision (nobody yet), the seed's delivery turned Staged, and
    node-1, now the first by name of the nodes still staging, led a rollout of its own."""
    monkeypatch.setattr(peering, "SEED_POLL_SECONDS", 0.0)
    events = []
    node = waiting_node(events)
    node.node_id = "node-1"
    origin = SimpleNamespace(scheme="http", uri="http://origin.example")
    got = node.around(origin, "sha256:x", rollout=True)
    assert got is not origin and [p.node for p in got.peers] == ["node-0"], events
    assert events[:2] == ["seed?", "holders?"], events
