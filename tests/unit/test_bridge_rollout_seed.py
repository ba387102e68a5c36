"""A node of a rollout waits for the seed (csi_bridge/peering.py): a seed that finishes
between two looks is a holder, not a seed that stopped. The CI run of stop 43 saw a node
fetch from the origin as the seed finished (its delivery Staged before the node asked who
holds the revision)."""

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
            return ["node-0"]
        state["staged"] = True   # the seed's delivery turns Staged just after this answer
        return []
    node.rollout_seed, node.holders = rollout_seed, holders
    return node


def test_a_seed_that_finishes_between_two_looks_is_taken_as_a_holder(monkeypatch):
    monkeypatch.setattr(peering, "SEED_POLL_SECONDS", 0.0)
    events = []
    assert waiting_node(events).await_seed("node-0", "sha256:x") == ["node-0"]
    assert events == ["seed?", "holders?", "seed?", "holders?"]
