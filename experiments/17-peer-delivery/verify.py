"""Recompute every summary.json from its raw.json, check that every sample is what its arm
says (staged on the three nodes; with peers, the two nodes other than the first took bytes
from peers; without, no node did; with the seed killed, it was, and no chunk was reported
corrupt); then redraw rollout.png from raw.json.

``python verify.py [FOLDER ...]``: by default every ``*/raw.json`` next to this script."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import benchkit  # noqa: E402
from run import ARMS, NODES, draw, recompute, report  # noqa: E402


def problems(raw: dict) -> list[str]:
    """One line per sample that is off its arm; empty when every sample is as its arm says."""
    out = []
    for s in raw["samples"]:
        wrong = []
        if s["stage_nodes"] != NODES:
            wrong.append(f"staged on {s['stage_nodes']} (want {NODES})")
        took = sorted(n for n, b in s["peer_bytes"].items() if b)
        if s["arm"] == "peers_killed":   # they may have taken nothing yet when the seed died
            if s.get("killed_after_patch_seconds") is None:
                wrong.append("the seed's bridge was not killed")
            if s["corrupt_reports"]:
                wrong.append(f"{s['corrupt_reports']} corrupt chunks reported")
            if s["seed"] in took:
                wrong.append("the seed took bytes from peers")
        else:
            want = [n for n in NODES if n != s["seed"]] if ARMS[s["arm"]] else []
            if took != want:
                wrong.append(f"nodes that took bytes from peers {took} (want {want})")
        if wrong:
            out.append(f"{s['arm']} round {s['round']}: " + "; ".join(wrong))
    return out


def main(argv: list[str]) -> int:
    for _, summary in benchkit.verify_folders(HERE, argv, problems, recompute, draw):
        report(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
