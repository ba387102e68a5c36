"""The main job: Resident's whole flow on a real single-node cluster on this machine.

1. Bring up the local cluster (etcd, kube-apiserver, controller-manager, scheduler,
   containerd, kubelet; built from Debian sources once, then cached).
2. Install Resident with its Helm chart: the operator Deployment, the bridge DaemonSet
   (registered with kubelet as CSI driver bundles.resident.dev), the CRDs.
3. Generate a demo model in four revisions and push them to a bundle server on 127.0.0.1.
4. Apply a ResidentModel (cpu backend), wait until it is Ready, and complete a prompt as
   an application would: an OpenAI request through the model's Service (on this node,
   which runs no kube-proxy, sent to the Service's ready endpoint).
5. Three transitions: graph-only, in place (rows), whole bundle rebased on the donor.
   A table of each transition's path, bytes and durations, from the model's status.
6. Delete the model and show that no Pod, BundleDelivery, lease or mount is left.
Every process started is stopped, and what kubelet changed on the machine is restored.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

from .install import install
from .node import LocalCluster
from .scenario import (BundleServer, Story, format_table, make_bundles, model_body, transition_row,
                       whole_bundle_reload)

NAMESPACE, NAME = "demo", "tiny-lm"


def step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def show_completion(story: Story) -> None:
    """What an application does: an OpenAI completion through the model's Service."""
    address, answer = story.complete("Resident keeps models")
    rm = story.get()
    print(f"    POST {rm['status']['endpoint']}/v1/completions (on this node: its endpoint {address})")
    print(f"    -> text {answer['choices'][0]['text']!r} from revision {answer['system_fingerprint'][:19]}"
          f" (status identity {rm['status']['identity']['bundle'][:19]}; the demo model has random weights)")


def run(size_mib: int, work: Path, keep: bool) -> int:
    began = time.monotonic()
    step(f"generating a {size_mib} MiB demo model in 4 revisions under {work}")
    revs, dirs = make_bundles(work, size_mib * 2**20)
    for k in "abcd":
        print(f"    rev {k.upper()}: {getattr(revs, k)}")

    step("starting the local cluster on 127.0.0.1 (first run builds Kubernetes and the image)")
    with LocalCluster() as cluster, BundleServer(work / "served", work / "logs") as server:
        print(f"    node {cluster.node_name} Ready; API at {cluster.server}")
        step(f"pushing the revisions to the bundle server {server.url}")
        for k in "abcd":
            server.push(dirs[k])
        step("installing Resident with its Helm chart (operator, bridge DaemonSet, CSIDriver, CRDs)")
        installation = install(cluster)
        print(cluster.kubectl("get", "pods,daemonsets,deployments", "-n", installation.namespace).stdout)
        print(cluster.kubectl("get", "csidrivers").stdout, end="")

        cluster.kubectl("create", "namespace", NAMESPACE)
        cluster.wait_for_service_account(NAMESPACE)
        story = Story(cluster, NAMESPACE, NAME, installation.bridge_root)
        step(f"applying ResidentModel {NAMESPACE}/{NAME} on revision A")
        story.apply(model_body(NAME, server.url, revs.a))
        story.wait_ready(revs.a)
        print(cluster.kubectl("get", "rm", "-n", NAMESPACE).stdout, end="")
        print(cluster.kubectl("get", "endpoints", NAME, "-n", NAMESPACE).stdout, end="")
        show_completion(story)

        rows = []
        for label, spec in [
            ("A->B graph", {"bundle": {"source": server.url, "digest": revs.b}}),
            ("B->C rows", {"bundle": {"source": server.url, "digest": revs.c}}),
            ("C->D rebase", whole_bundle_reload(server.url, revs.d)),
        ]:
            step(f"transition {label}")
            last = story.transition(spec)
            rows.append(transition_row(label, last))
            print("    " + format_table(rows[-1:]).splitlines()[1])
        show_completion(story)
        step("transitions, from the ResidentModel's status.lastTransition")
        print(format_table(rows))
        print(cluster.kubectl("describe", "rm", NAME, "-n", NAMESPACE).stdout.split("Events:")[-1][:3000])

        step("deleting the ResidentModel")
        story.delete_and_wait_gone()
        left = story.leftovers()
        for what, items in left.items():
            print(f"    {what:<17} {len(items)} left {items if items else ''}")
        if keep:
            step(f"cluster kept running; KUBECONFIG={cluster.kubeconfig}; Ctrl-C stops it")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        step("stopping every process and restoring the machine")
    print(f"\ndone in {time.monotonic() - began:.0f}s")
    return 1 if any(left.values()) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/demo", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=64,
                        help="weights size of the demo model in MiB (default 64; try 1024)")
    parser.add_argument("--work", type=Path, default=None,
                        help="where bundles are generated (default: a new temporary directory)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the cluster running at the end until Ctrl-C")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every step of the harness")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    work = args.work or Path(tempfile.mkdtemp(prefix="resident-demo-"))
    return run(args.size_mib, work, args.keep)


if __name__ == "__main__":
    sys.exit(main())
