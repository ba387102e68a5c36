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

With ``--backend torch`` the model is a Hugging Face checkpoint instead: a tiny
Llama-style one that ``resident bundle make-demo --format hf`` makes (random weights, a
real tokenizer), in three revisions: A, B with 5% of A's rows changed (applied in place)
and C with B's config.json changed (a new module: reload). The owner runs the torch
backend in the owner-torch image (the project image plus the ``torch`` extra, CPU build;
built on first use, about 1.5 minutes, then cached), which the model names in
``spec.runtime.image``; the install's default owner image stays the small one.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .images import owner_torch_image
from .install import install
from .node import LocalCluster
from .scenario import (BundleServer, Story, format_table, make_bundles, make_hf_bundles, model_body, transition_row,
                       whole_bundle_reload)

NAMESPACE, NAME = "demo", "tiny-lm"


def step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def show_completion(story: Story, prompt: str = "Resident keeps models") -> None:
    """What an application does: an OpenAI completion through the model's Service."""
    address, answer = story.complete(prompt)
    rm = story.get()
    print(f"    POST {rm['status']['endpoint']}/v1/completions (on this node: its endpoint {address})")
    print(f"    -> text {answer['choices'][0]['text']!r} from revision {answer['system_fingerprint'][:19]}"
          f" (status identity {rm['status']['identity']['bundle'][:19]}; the demo model has random weights)")


@dataclass
class DemoModel:
    """The revisions a demo run pushes and the transitions it makes between them."""

    digests: dict[str, str]                    # by letter, A first
    dirs: dict[str, Path]
    transitions: list[tuple[str, str, bool]]   # (label, to revision, as a whole bundle rebased and reloaded)
    prompt: str
    image: tuple[str, Path] | None = None      # the owner image (name, tarball); None: the install's own


def demo_model(backend: str, work: Path, size_mib: int) -> DemoModel:
    if backend == "torch":
        step(f"generating a {size_mib} MiB Hugging Face checkpoint (Llama-style) in 3 revisions under {work}")
        digests, dirs = make_hf_bundles(work, size_mib * 2**20)
        step("building the owner-torch image (project image + the torch extra; cached after the first run)")
        image = owner_torch_image()
        print(f"    {image[0]}")
        return DemoModel(digests, dirs, [("A->B rows", "b", False), ("B->C config", "c", False)],
                         "the model revision", image)
    step(f"generating a {size_mib} MiB demo model in 4 revisions under {work}")
    revs, dirs = make_bundles(work, size_mib * 2**20)
    return DemoModel({k: getattr(revs, k) for k in "abcd"}, dirs,
                     [("A->B graph", "b", False), ("B->C rows", "c", False), ("C->D rebase", "d", True)],
                     "Resident keeps models")


def run(size_mib: int, work: Path, keep: bool, backend: str = "cpu") -> int:
    began = time.monotonic()
    model = demo_model(backend, work, size_mib)
    for k, digest in model.digests.items():
        print(f"    rev {k.upper()}: {digest}")

    step("starting the local cluster on 127.0.0.1 (first run builds Kubernetes and the image)")
    with LocalCluster() as cluster, BundleServer(work / "served", work / "logs") as server:
        print(f"    node {cluster.node_name} Ready; API at {cluster.server}")
        step(f"pushing the revisions to the bundle server {server.url}")
        for bundle_dir in model.dirs.values():
            server.push(bundle_dir)
        step("installing Resident with its Helm chart (operator, bridge DaemonSet, CSIDriver, CRDs)")
        installation = install(cluster)
        if model.image:
            cluster.import_image(model.image[1])
        print(cluster.kubectl("get", "pods,daemonsets,deployments", "-n", installation.namespace).stdout)
        print(cluster.kubectl("get", "csidrivers").stdout, end="")

        cluster.kubectl("create", "namespace", NAMESPACE)
        cluster.wait_for_service_account(NAMESPACE)
        story = Story(cluster, NAMESPACE, NAME, installation.bridge_root)
        step(f"applying ResidentModel {NAMESPACE}/{NAME} ({backend} backend) on revision A")
        story.apply(model_body(NAME, server.url, model.digests["a"], image=model.image and model.image[0]))
        story.wait_ready(model.digests["a"])
        print(cluster.kubectl("get", "rm", "-n", NAMESPACE).stdout, end="")
        print(cluster.kubectl("get", "endpoints", NAME, "-n", NAMESPACE).stdout, end="")
        show_completion(story, model.prompt)

        rows = []
        for label, k, whole in model.transitions:
            step(f"transition {label}")
            digest = model.digests[k]
            last = story.transition(whole_bundle_reload(server.url, digest) if whole
                                    else {"bundle": {"source": server.url, "digest": digest}})
            rows.append(transition_row(label, last))
            print("    " + format_table(rows[-1:]).splitlines()[1])
            if model.image:   # a real checkpoint: each revision answers differently
                show_completion(story, model.prompt)
        if not model.image:
            show_completion(story, model.prompt)
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
    parser.add_argument("--backend", choices=("cpu", "torch"), default="cpu",
                        help="cpu (default): the project's numpy model in 4 revisions; torch: a tiny "
                             "Hugging Face Llama-style checkpoint in 3 revisions (rows in place, config "
                             "change by reload), served by the torch backend from the owner-torch image "
                             "(built on first use, about 1.5 minutes; needs the torch extra, which "
                             "scripts/bootstrap installs)")
    parser.add_argument("--size-mib", type=int, default=None,
                        help="weights size of the demo model in MiB (default 64 for cpu, 4 for torch; "
                             "try 1024 for cpu)")
    parser.add_argument("--work", type=Path, default=None,
                        help="where bundles are generated (default: a new temporary directory)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the cluster running at the end until Ctrl-C")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every step of the harness")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    work = args.work or Path(tempfile.mkdtemp(prefix="resident-demo-"))
    size = args.size_mib or (4 if args.backend == "torch" else 64)
    return run(size, work, args.keep, args.backend)


if __name__ == "__main__":
    sys.exit(main())
