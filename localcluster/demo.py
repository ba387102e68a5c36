"""The main job: Resident's whole flow on a real cluster on this machine.

1. Bring up the local cluster: etcd, kube-apiserver, controller-manager, scheduler, and
   one node (``--nodes N``: N nodes), each with containerd, kubelet and kube-proxy in a
   network namespace of its own, with a Pod network and cluster DNS. Kubernetes is built
   from its Go modules once, then cached.
2. Install Resident with its Helm chart: the operator Deployment, the bridge DaemonSet
   (registered with kubelet as CSI driver bundles.resident.dev), the CRDs.
3. Generate a demo model in four revisions and push them to a bundle server on 127.0.0.1,
   which the cluster reaches at this machine's address on the cluster network.
4. Apply a ResidentModel (cpu backend), wait until it is Ready, and complete a prompt as
   an application would: an OpenAI request to the model's Service, at its ClusterIP
   (kube-proxy picks the owner).
5. Three transitions: graph-only, in place (rows), whole bundle rebased on the donor.
   A table of each transition's path, bytes and durations, from the model's status.
   On several nodes the model has one owner per node (``replicas`` = N, spread by the
   chart's default), each node's bridge delivers on its own, the reload rolls over the
   nodes, and a second table shows what each node fetched and reused.
6. Delete the model and show that no Pod, BundleDelivery, lease or mount is left.
Every process started is stopped, and what kubelet changed on the machine is restored.

Each step prints one line with the time since the run began (``[ 12.3s] cluster up``;
:mod:`localcluster.progress`); what apt, pip and the first-run Kubernetes build print goes
to log files, and the build shows its progress. The run ends with a summary of what it
showed (:mod:`localcluster.demo_summary`): the transitions table, the time to Ready, the
revisions that answered through the Service, each switch, and the clean teardown.

With ``--backend torch`` the model is a Hugging Face checkpoint instead: a tiny
Llama-style one that ``resident bundle make-demo --format hf`` makes (random weights, a
real tokenizer), in three revisions: A, B with 5% of A's rows changed (applied in place)
and C with B's config.json changed (a new module: reload). The owner runs the torch
backend in the owner-torch image (the project image plus torch for the CPU, 2.4 GiB;
built on first use, about 5 minutes, then cached), which the model names in
``spec.runtime.image``; the install's default owner image stays the small one.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .demo_picture import draw_transitions
from .demo_summary import DemoFacts, node_table, summary, transition_line
from .images import cached_image_names, owner_torch_image, project_image
from .install import install
from .node import LocalCluster
from .progress import detail, duration, stamp
from .scenario import BundleServer, Story, make_bundles, make_hf_bundles, model_body, whole_bundle_reload

NAMESPACE, NAME = "demo", "tiny-lm"
EVENTS_SHOWN = 8


def show_completion(story: Story, prompt: str, letter: str, facts: DemoFacts) -> None:
    """What an application does: an OpenAI completion through the model's Service."""
    address, answer = story.complete(prompt)
    endpoint = story.get()["status"]["endpoint"]
    digest = answer["system_fingerprint"]
    facts.answers.append((letter, digest))
    detail(f"POST {endpoint}/v1/completions (its ClusterIP {address})\n"
           f"-> {answer['choices'][0]['text']!r} from revision {letter} {digest[:19]}"
           f"{' (random weights, so random words)' if facts.backend == 'cpu' else ''}")


def owner_uids(story: Story) -> list[str]:
    return sorted(o.get("uid", "") for o in story.get()["status"].get("owners") or [])


def show_events(cluster, facts: DemoFacts) -> None:
    """The model's Kubernetes Events, oldest first, one line each."""
    events = json.loads(cluster.kubectl("get", "events", "-n", NAMESPACE, "-o", "json",
                                        f"--field-selector=involvedObject.name={NAME}").stdout)["items"]
    # timestamps have whole seconds; the resourceVersion orders the writes within one
    events.sort(key=lambda e: (e.get("lastTimestamp") or e.get("eventTime") or "",
                               int(e["metadata"].get("resourceVersion") or 0)))
    shown = events[-EVENTS_SHOWN:]
    stamp(f"the model's Events (last {len(shown)} of {len(events)}; kubectl describe rm {NAME} -n {NAMESPACE})")
    detail("\n".join(f"{e.get('type', ''):<8} {e.get('reason', ''):<22} {clip(e.get('message') or '', 80)}"
                      for e in shown))


def show_plugin_view(cluster) -> None:
    """The model as the project's kubectl plugin shows it (``kubectl resident``, found on
    PATH as ``kubectl-resident``, as kubectl finds plugins; flags after the plugin's name)."""
    stamp("the model as `kubectl resident get` and `history` show it (the project's kubectl plugin):")
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    for verb in ("get", "history"):
        done = subprocess.run([str(cluster.bin_dir / "kubectl"), "resident", verb, NAME, "-n", NAMESPACE],
                              env=env, text=True, capture_output=True, timeout=60)
        detail(done.stdout if done.returncode == 0 else f"kubectl resident {verb} failed: {done.stderr.strip()}")


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


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
        digests, dirs = make_hf_bundles(work, size_mib * 2**20)
        stamp(f"generated a {size_mib} MiB Hugging Face checkpoint (Llama-style) in 3 revisions under {work}")
        show_revisions(digests)
        stamp("owner-torch image (project image + torch for the CPU; about 5 min the first time) ...")
        image = owner_torch_image()
        stamp(f"owner-torch image {image[0]}")
        return DemoModel(digests, dirs, [("A->B rows", "b", False), ("B->C config", "c", False)],
                         "the model revision", image)
    revs, dirs = make_bundles(work, size_mib * 2**20)
    digests = {k: getattr(revs, k) for k in "abcd"}
    stamp(f"generated a {size_mib} MiB demo model in 4 revisions under {work}")
    show_revisions(digests)
    return DemoModel(digests, dirs,
                     [("A->B graph", "b", False), ("B->C rows", "c", False), ("C->D rebase", "d", True)],
                     "Resident keeps models")


def show_revisions(digests: dict[str, str]) -> None:
    detail("\n".join(f"rev {k.upper()}: {digest}" for k, digest in digests.items()))


def ensure_project_image() -> None:
    """Build the project image now (a first run takes minutes) so the install step is only the install."""
    cached = cached_image_names()
    began = time.monotonic()
    name, _ = project_image()
    how = "cached" if name in cached else f"built in {duration(time.monotonic() - began)}"
    stamp(f"project image {name} (operator, bridge and owner in one): {how}")


def run(size_mib: int, work: Path, keep: bool, backend: str = "cpu", nodes: int = 1) -> int:
    began = time.monotonic()
    model = demo_model(backend, work, size_mib)
    facts = DemoFacts(f"{NAMESPACE}/{NAME}", backend, size_mib)

    stamp("starting the local cluster (the first run on a machine builds Kubernetes: about 20 min) ...")
    cluster = LocalCluster(nodes=nodes)
    with cluster, BundleServer(work / "served", work / "logs", cluster=cluster) as server:
        waited = cluster.timings.get("lock_wait_seconds", 0)
        ready = ", ".join(f"{n.name} at {n.address.address}" for n in cluster.nodes)
        stamp(f"cluster up in {duration(cluster.timings['start_seconds'])}: Kubernetes {cluster.version}, "
              f"Ready: {ready}; API {cluster.server}"
              + (f" (first waited {duration(waited)} for another run on this machine)" if waited >= 1 else ""))
        for bundle_dir in model.dirs.values():
            server.push(bundle_dir)
        stamp(f"{len(model.dirs)} revisions on the bundle server {server.url}")
        ensure_project_image()
        installed = time.monotonic()
        installation = install(cluster)
        if model.image:
            cluster.import_image(model.image[1])
        stamp(f"Resident installed by its Helm chart in {duration(time.monotonic() - installed)}: operator, "
              f"bridge (CSI driver bundles.resident.dev), CRDs")
        detail(cluster.kubectl("get", "pods", "-n", installation.namespace).stdout)

        cluster.kubectl("create", "namespace", NAMESPACE)
        cluster.wait_for_service_account(NAMESPACE)
        story = Story(cluster, NAMESPACE, NAME, installation.bridge_root)
        applied = time.monotonic()
        body = model_body(NAME, server.url, model.digests["a"], image=model.image and model.image[0])
        body["spec"]["replicas"] = nodes
        story.apply(body)
        stamp(f"applied ResidentModel {NAMESPACE}/{NAME} ({backend} backend, {nodes} replica"
              f"{'s' if nodes > 1 else ''}) on revision A ...")
        story.wait_ready(model.digests["a"])
        facts.ready_seconds = time.monotonic() - applied
        stamp(f"{NAME} Ready in {duration(facts.ready_seconds)}")
        detail(cluster.kubectl("get", "rm", "-n", NAMESPACE).stdout)
        if nodes > 1:
            detail(cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide").stdout)
        show_completion(story, model.prompt, "A", facts)

        facts.owner_pods += owner_uids(story)
        for label, k, whole in model.transitions:
            digest = model.digests[k]
            last = story.transition(whole_bundle_reload(server.url, digest) if whole
                                    else {"bundle": {"source": server.url, "digest": digest}})
            facts.transitions.append((label, last))
            stamp(f"transition {transition_line(label, last)}")
            if nodes > 1:
                detail(node_table([(label, last)]))
            if model.image:   # a real checkpoint: each revision answers differently
                show_completion(story, model.prompt, k.upper(), facts)
        facts.owner_pods += owner_uids(story)
        if not model.image:
            show_completion(story, model.prompt, model.transitions[-1][1].upper(), facts)
        show_events(cluster, facts)
        facts.picture = draw_transitions(facts.transitions, work / "transitions.png",
                                         f"{NAMESPACE}/{NAME}: revision switches ({backend}, {size_mib} MiB)")
        show_plugin_view(cluster)

        deleted = time.monotonic()
        story.delete_and_wait_gone()
        facts.leftovers = story.leftovers()
        left = {what: items for what, items in facts.leftovers.items() if items}
        stamp(f"ResidentModel deleted in {duration(time.monotonic() - deleted)}; "
              + (f"LEFT BEHIND: {left}" if left else f"nothing left ({', '.join(facts.leftovers)}: none)"))
        if keep:
            stamp(f"cluster kept running; KUBECONFIG={cluster.kubeconfig}; Ctrl-C stops it")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        stamp("stopping every process and restoring the machine ...")
    facts.teardown_seconds = cluster.timings.get("teardown_seconds")
    facts.total_seconds = time.monotonic() - began
    stamp(f"machine restored in {duration(facts.teardown_seconds or 0)}")
    print(f"\nWhat this run showed\n\n{summary(facts)}\n", flush=True)
    return 1 if any(facts.leftovers.values()) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/demo", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("cpu", "torch"), default="cpu",
                        help="cpu (default): the project's numpy model in 4 revisions; torch: a tiny "
                             "Hugging Face Llama-style checkpoint in 3 revisions (rows in place, config "
                             "change by reload), served by the torch backend from the owner-torch image "
                             "(built on first use, about 5 minutes; needs torch, which "
                             "scripts/bootstrap installs)")
    parser.add_argument("--size-mib", type=int, default=None,
                        help="weights size of the demo model in MiB (default 64 for cpu, 4 for torch; "
                             "try 1024 for cpu)")
    parser.add_argument("--work", type=Path, default=None,
                        help="where bundles are generated (default: a new temporary directory)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the cluster running at the end until Ctrl-C")
    parser.add_argument("--nodes", type=int, default=1, choices=range(1, 6), metavar="N",
                        help="nodes in the local cluster, 1 to 5 (default 1); the model gets one owner "
                             "per node, and the run shows what each node's bridge moved")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every step of the harness")
    args = parser.parse_args(argv)
    from bundle.jsonlog import configure
    configure(logging.INFO if args.verbose else logging.WARNING, json_lines=False)
    work = args.work or Path(tempfile.mkdtemp(prefix="resident-demo-"))
    size = args.size_mib or (4 if args.backend == "torch" else 64)
    return run(size, work, args.keep, args.backend, args.nodes)


if __name__ == "__main__":
    sys.exit(main())
