"""Free loopback ports for the servers tests start (localcluster/processes.py): several
chosen at once never repeat (SeaweedFS got one port for two of its servers in a CI run of
stop 51, and its volume server died with "address already in use")."""

import socket

import pytest

from localcluster.processes import free_ports

pytestmark = pytest.mark.unit


def test_ports_chosen_together_are_all_different_and_free():
    ports = free_ports(64)
    assert len(set(ports)) == 64, sorted(ports)
    for port in ports[:8]:   # and nothing holds them once chosen
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
