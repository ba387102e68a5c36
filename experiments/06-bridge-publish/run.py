"""How long a CSI publish takes when the node must fetch the bundle, when another Pod
already brought it to the node, and when kubelet merely retries a finished publish.

Arms (all through real gRPC on a unix socket to an in-process bridge, real read-only bind
mounts, a file:// source on the same disk):
- ``cold``: empty store; the publish fetches and verifies every chunk, hardlinks the
  revision into a volume, bind-mounts it read-only and checks mountinfo.
- ``warm``: the revision is already in the store (a second Pod of the same bundle); only
  the hardlink tree and the mount are made. ``store_bytes_added`` shows no second copy.
- ``confirm``: the same publish again on a published target (kubelet's retry).
Each sample unpublishes what it published. Rounds alternate the arm order (benchkit).
Usage: ``python experiments/06-bridge-publish/run.py [--mib 64] [--rounds 5]`` (as root).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE.parent))

import benchkit  # noqa: E402
from csi_bridge.proto import csi_pb2  # noqa: E402
from csi_bridge.server import Bridge, BridgeConfig  # noqa: E402
from testkit.bridge import CsiClient, cleanup_mounts, make_bundle, publish_request  # noqa: E402

CHUNK = 4 * 1024 * 1024


def new_bridge(root: Path) -> tuple[Bridge, CsiClient]:
    b = Bridge(BridgeConfig(endpoint=f"unix://{root}/csi.sock", node_id="bench", root=root / "data",
                            authorize="allow-any", private_metrics=True)).start()
    return b, CsiClient(root / "csi.sock")


def timed_publish(bridge: Bridge, client: CsiClient, req) -> dict:
    before = bridge.store.usage_bytes()
    t0 = time.perf_counter()
    client.node.NodePublishVolume(req)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "store_bytes_added": bridge.store.usage_bytes() - before}


def unpublish(client: CsiClient, req) -> None:
    client.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
        volume_id=req.volume_id, target_path=req.target_path))


def recompute(raw: dict) -> dict:
    summary = benchkit.summarize(raw["samples"], "seconds",
                                 {"cold_over_warm": ("cold", "warm"), "warm_over_confirm": ("warm", "confirm")})
    summary["store_bytes_added_max"] = {
        arm: max(s["store_bytes_added"] for s in raw["samples"] if s["arm"] == arm)
        for arm in sorted({s["arm"] for s in raw["samples"]})}
    summary["bundle_bytes"] = raw["bundle_bytes"]
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=64, help="size of the weights file in MiB")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (>= 5)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-", dir="/tmp"))
    try:
        files = {"model.safetensors": os.urandom(args.mib * 2**20), "graph.onnx": os.urandom(2**19),
                 "config.json": b'{"layers": 2}'}
        digest = make_bundle(tmp / "src", files, CHUNK)
        source = f"file://{tmp}/src"
        warm_bridge, warm_client = new_bridge(tmp / "warm")
        seed = publish_request("seed", tmp / "warm-seed" / "mount", digest, source)
        warm_client.node.NodePublishVolume(seed)  # the first Pod: brings the bundle to the node
        counter = iter(range(10**6))

        def cold() -> dict:
            root = tmp / f"cold-{next(counter)}"
            bridge, client = new_bridge(root)
            try:
                req = publish_request("v", root / "pod" / "mount", digest, source)
                sample = timed_publish(bridge, client, req)
                unpublish(client, req)
                return sample
            finally:
                client.close()
                bridge.stop()
                shutil.rmtree(root)

        def warm() -> dict:
            req = publish_request(f"w{next(counter)}", tmp / "warm-pod" / "mount", digest, source)
            sample = timed_publish(warm_bridge, warm_client, req)
            unpublish(warm_client, req)
            return sample

        def confirm() -> dict:
            return timed_publish(warm_bridge, warm_client, seed)

        samples = benchkit.run_rounds(args.rounds, {"cold": cold, "warm": warm, "confirm": confirm})
        unpublish(warm_client, seed)
        warm_client.close()
        warm_bridge.stop()
        raw = {"mib": args.mib, "bundle_bytes": sum(map(len, files.values())), "chunk_size": CHUNK,
               "samples": samples}
        benchkit.write(HERE, raw, recompute(raw))
        print((HERE / "summary.json").read_text())
    finally:
        cleanup_mounts(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
