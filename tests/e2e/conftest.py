"""The e2e layer's shared node: one LocalCluster with Resident installed by its chart,
demo bundles in four revisions on a bundle server, for every test of this folder that
asks for ``world``. It is set up when first needed and stopped at the end of the session;
tests that start and stop clusters of their own (the node tests, the several-nodes
module) run before it exists, whatever their names: one kubelet per machine
(:func:`pytest_collection_modifyitems` orders them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pytest
from kubernetes import client

from bundle.cpu_model import make_revision
from localcluster.install import install
from localcluster.node import LocalCluster
from localcluster.scenario import CHUNK, GROUP, VERSION, BundleServer, Story, make_bundles, model_body

SIZE = 16 * 2**20


class World(NamedTuple):
    cluster: Any
    server: BundleServer
    revs: Any
    installation: Any
    dirs: dict[str, Path]

    def story(self, namespace: str, name: str = "story") -> Story:
        """A Story for a model in a new namespace."""
        self.cluster.kubectl("create", "namespace", namespace)
        self.cluster.wait_for_service_account(namespace)
        return Story(self.cluster, namespace, name, self.installation.bridge_root)

    def ready(self, namespace: str, digest: str, **spec: Any) -> Story:
        """A model applied in a fresh namespace (``spec`` overrides), Ready on ``digest`` and
        answering through its Service."""
        story = self.story(namespace)
        body = model_body(story.name, self.server.url, digest)
        body["spec"].update(spec)
        story.apply(body)
        story.wait_ready(digest)
        story.wait_routed()
        return story

    def fresh_revision(self, base: str, kind: str, seed: int) -> str:
        """A new revision of ``kind`` derived from revision ``base``, pushed: not on the node yet.
        Its folder is ``dirs[f"fresh-{seed}"]``; each test takes seeds of its own."""
        if f"fresh-{seed}" in self.dirs:
            raise ValueError(f"seed {seed} is taken by another test's revision")
        target = self.dirs[base].parent / f"fresh-{seed}"
        digest = make_revision(self.dirs[base], target, kind, fraction=0.005, seed=seed,
                               chunk_size=CHUNK).digest
        self.server.push(target)
        self.dirs[target.name] = target
        return digest


def pytest_collection_modifyitems(config, items):
    """Tests without ``world`` first (they start clusters of their own), then the rest, each
    group in its collected order: the shared cluster holds the machine's node lock from its
    first use to the end of the session."""
    here = Path(__file__).parent

    def shares_the_cluster(item) -> bool:
        return Path(str(item.fspath)).parent == here and "world" in getattr(item, "fixturenames", ())

    items.sort(key=shares_the_cluster)      # only this folder's tests move: to its end


@pytest.fixture(scope="package")
def world(tmp_path_factory):
    work = tmp_path_factory.mktemp("story")
    revs, dirs = make_bundles(work, SIZE)
    with LocalCluster() as cluster, BundleServer(work / "served", work / "logs", cluster=cluster) as server:
        for d in dirs.values():
            server.push(d)
        yield World(cluster, server, revs, install(cluster), dirs)


@pytest.fixture(scope="package")
def slow_url(world, tmp_path_factory):
    """The same bundles from a source that sends 256 KiB/s, so that a transition to a revision
    the node does not hold yet lasts long enough for a fault test to interrupt it (the
    operator itself takes well under 1 s)."""
    with BundleServer(world.server.root, tmp_path_factory.mktemp("slow-logs"), rate=256 << 10,
                      cluster=world.cluster) as slow:
        yield slow.url


@pytest.fixture(autouse=True)
def no_model_outlives_its_test(request):
    """After a test on the shared cluster, delete every ResidentModel it left (a failed test
    stops before its own cleanup): the tests after it check the node's leases and mounts, and
    a leftover model would fail them for a reason that is not theirs."""
    yield
    if "world" not in request.fixturenames:
        return
    world = request.getfixturevalue("world")
    custom = client.CustomObjectsApi(world.cluster.api_client())
    for rm in custom.list_cluster_custom_object(GROUP, VERSION, "residentmodels")["items"]:
        meta = rm["metadata"]
        Story(world.cluster, meta["namespace"], meta["name"], world.installation.bridge_root).delete_and_wait_gone()
