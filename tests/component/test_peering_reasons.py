"""Finding peers (csi_bridge/peering.py) against a real HTTP peer address that does not
answer: a delivery that goes to the origin says why each peer did not count."""

from __future__ import annotations

import logging

import pytest
from kubernetes import client

from csi_bridge.peering import Peering, PeerSettings
from localcluster.processes import free_port

pytestmark = pytest.mark.component
DIGEST = "sha256:" + "0" * 64


@pytest.fixture
def peering(tmp_path):
    (tmp_path / "token").write_text("not-a-real-token\n")
    settings = PeerSettings(address="127.0.0.1", port=0, namespace="resident-system",
                            selector="app.kubernetes.io/component=bridge",
                            account="system:serviceaccount:resident-system:bridge",
                            token_file=tmp_path / "token")
    p = Peering(None, client.ApiClient(), "node-a", settings).start()
    yield p
    p.stop()


def test_no_holder_among_the_peers_asked_is_logged_with_each_peers_reason(peering, caplog):
    away = ("node-b", f"127.0.0.1:{free_port()}")   # nothing listens there
    with caplog.at_level(logging.INFO, logger="resident.bridge.peers"):
        assert peering.holders(DIGEST, [away], say_why=True) == []
    said = [r for r in caplog.records if r.getMessage() == "no peer holds the revision"]
    assert len(said) == 1 and said[0].digest == DIGEST
    assert list(said[0].peers) == ["node-b"] and "Connection" in said[0].peers["node-b"], said[0].peers


def test_a_seed_wait_asks_again_and_again_without_saying_so_each_time(peering, caplog):
    away = ("node-b", f"127.0.0.1:{free_port()}")
    with caplog.at_level(logging.INFO, logger="resident.bridge.peers"):
        assert peering.holders(DIGEST, [away]) == []
    assert not [r for r in caplog.records if r.getMessage() == "no peer holds the revision"]
