"""The demo's closing summary: every claim comes from the facts the run collected."""

from __future__ import annotations

from localcluster.demo_summary import DemoFacts, summary, transition_line

MIB = 2**20


def last(path: str, method: str, strategy: str, fetched: int, reused: int, total: float) -> dict:
    return {"path": path, "method": method, "strategy": strategy, "result": "Succeeded",
            "bytes": {"fetched": fetched, "reused": reused, "written": fetched},
            "durations": {"totalSeconds": total, "deliverSeconds": 0.1, "applySeconds": 0.2}}


def facts(**changes) -> DemoFacts:
    f = DemoFacts("demo/tiny-lm", "cpu", 64, ready_seconds=14.26,
                  answers=[("A", "sha256:aaaaaaaaaaaaaaaaaaaa"), ("D", "sha256:dddddddddddddddddddd")],
                  transitions=[("A->B graph", last("GraphOnly", "graph-only", "InPlace", 4096, 64 * MIB, 0.41)),
                               ("C->D rebase", last("WholeBundle", "rebase", "Reload", MIB // 2, 63 * MIB, 2.5))],
                  owner_pods=["uid-1", "uid-1"],
                  leftovers={"pods": [], "bundleDeliveries": [], "leases": []},
                  teardown_seconds=9.84, total_seconds=125.0)
    for key, value in changes.items():
        setattr(f, key, value)
    return f


def test_a_transition_reads_as_path_strategy_time_and_bytes():
    line = transition_line(*facts().transitions[1])
    assert line == "C->D rebase: whole bundle (rebase), reloaded, 2.50s (fetched 0.5 MiB, reused 63.0 MiB)"
    assert transition_line(*facts().transitions[0]).startswith("A->B graph: graph-only, in place, 0.41s")


def test_the_summary_is_the_table_and_a_few_claims():
    text = summary(facts())
    table, claims = text.split("\n\n")
    assert table.splitlines()[0].split()[:2] == ["transition", "path"] and len(table.splitlines()) == 3
    lines = claims.splitlines()
    assert 3 <= sum(line.startswith("  - ") for line in lines) <= 6
    assert "demo/tiny-lm (64 MiB, cpu backend) went from apply to Ready in 14.3s" in lines[0]
    assert "A (sha256:aaaaaaaa), D (sha256:dddddddd)" in lines[1]
    assert "2 revision switches, all in the same owner Pod:" in lines[2]
    assert "deleting the model left nothing behind (checked: pods, bundleDeliveries, leases)" in text
    assert "machine restored in 9.8s; the whole run took 2m05s" in text


def test_the_summary_claims_only_what_was_seen():
    text = summary(facts(owner_pods=["uid-1", "uid-2"], leftovers={"pods": ["tiny-lm-0"], "leases": []},
                         teardown_seconds=None))
    assert "same owner Pod" not in text                    # the owner was replaced: no such claim
    assert "deleting the model LEFT {'pods': ['tiny-lm-0']}" in text
    assert "machine restored" not in text


def test_on_several_nodes_the_summary_shows_what_each_node_moved():
    rows = [{"node": f"node-{i}", "owners": 1, "fetched": MIB * (i + 1), "reused": 63 * MIB, "written": MIB}
            for i in range(3)]
    one = last("WholeBundle", "rebase", "Reload", 6 * MIB, 189 * MIB, 3.0)
    text = summary(facts(transitions=[("C->D rebase", {**one, "nodes": rows})]))
    per_node = text.split("\n\n")[1].splitlines()
    assert per_node[0].split() == ["transition", "node", "owners", "fetched", "MiB", "reused", "MiB", "written", "MiB"]
    assert [line.split()[2] for line in per_node[1:]] == ["node-0", "node-1", "node-2"]
    assert [line.split()[4] for line in per_node[1:]] == ["1.0", "2.0", "3.0"]
    # one node: no per-node table
    assert "owners" not in summary(facts(transitions=[("C->D rebase", {**one, "nodes": rows[:1]})]))
