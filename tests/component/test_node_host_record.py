"""The host record (localcluster.teardown) against the real machine: it undoes iptables chains
and rules, bind mounts and sysctl changes made after it was taken, and nothing else.

The kubelet of the local node adds no iptables chains with makeIPTablesUtilChains=false, so
the e2e tests never exercise that path; here real chains are added and must disappear.
The test holds the node lock, so no LocalCluster starts while it changes the machine.
"""

from __future__ import annotations

import fcntl
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from localcluster.teardown import NODE_LOCK, HostRecord, leftovers, restore, take_record

SYSCTL = Path("/proc/sys/kernel/panic")   # seconds before reboot after a panic: harmless to change


@pytest.fixture
def node_lock():
    NODE_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(NODE_LOCK, "a+") as lock:
        deadline = time.monotonic() + 300
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"a LocalCluster held {NODE_LOCK} for 5 minutes")
                time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["iptables", "-w", "5", *args], capture_output=True, text=True, check=check)


def test_restore_undoes_chains_rules_mounts_and_sysctls(node_lock, tmp_path):
    managed = tmp_path / "managed"
    (managed / "a" / "b").mkdir(parents=True)
    source = tmp_path / "source"
    (source / "b").mkdir(parents=True)      # the nested mount point, seen through the bind mount
    record_path = tmp_path / "host.json"
    original_panic = SYSCTL.read_text().strip()
    chain = f"KUBE-TEST-{uuid.uuid4().hex[:6].upper()}"
    record = take_record([str(managed)], path=record_path)
    assert HostRecord.load(record_path) == record
    try:
        iptables("-N", chain)
        iptables("-A", chain, "-s", "127.0.0.9/32", "-j", "RETURN")
        iptables("-A", "INPUT", "-m", "comment", "--comment", "resident test jump", "-j", chain)
        iptables("-t", "nat", "-N", chain)
        subprocess.run(["mount", "--bind", str(source), str(managed / "a")], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "none", str(managed / "a" / "b")], check=True)
        SYSCTL.write_text("17")
        found = leftovers(record)
        assert f"sysctl kernel/panic=17 (was {original_panic})" in found
        assert f"mount {managed / 'a'}" in found and f"mount {managed / 'a' / 'b'}" in found
        assert any(chain in item for item in found)

        assert restore(record, path=record_path) == []
        assert SYSCTL.read_text().strip() == original_panic
        assert chain not in iptables("-S").stdout and chain not in iptables("-t", "nat", "-S").stdout
        assert str(managed) not in Path("/proc/self/mountinfo").read_text()
        assert not record_path.exists(), "a complete restore deletes the record"
        assert (managed / "a").is_dir(), "unmounting never deletes the mount point"
    finally:      # leave the machine clean even if an assertion failed half-way
        iptables("-D", "INPUT", "-m", "comment", "--comment", "resident test jump", "-j", chain, check=False)
        for table in ("filter", "nat"):
            iptables("-t", table, "-F", chain, check=False)
            iptables("-t", table, "-X", chain, check=False)
        for point in (managed / "a" / "b", managed / "a"):
            subprocess.run(["umount", str(point)], capture_output=True)
        SYSCTL.write_text(original_panic)


def test_restore_leaves_what_was_there_before(node_lock, tmp_path):
    managed = tmp_path / "managed"
    managed.mkdir()
    source = tmp_path / "source"
    source.mkdir()
    chain = f"KUBE-KEEP-{uuid.uuid4().hex[:6].upper()}"
    subprocess.run(["mount", "--bind", str(source), str(managed)], check=True)
    iptables("-N", chain)
    try:
        record = take_record([str(managed)], path=tmp_path / "host.json")
        assert restore(record, path=tmp_path / "host.json") == []
        assert f"-N {chain}" in iptables("-S").stdout
        assert str(managed) in Path("/proc/self/mountinfo").read_text()
    finally:
        subprocess.run(["umount", str(managed)], capture_output=True)
        iptables("-X", chain, check=False)
