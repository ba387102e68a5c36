"""Undoing what a kubelet node does to the machine, from a record taken before it started.

A kubelet changes the host, not just its own directory. It sets sysctls
(``vm.overcommit_memory=1``, ``kernel.panic=10``, ``kernel.panic_on_oops=1``, ...),
bind-mounts ``/var/lib/kubelet`` onto itself and mounts volumes under it, may add KUBE-*
iptables chains, and creates ``kubepods`` cgroups; containerd mounts container root
filesystems and network namespaces. Stopping the processes undoes none of that.

So before anything starts, :func:`take_record` writes a :class:`HostRecord` to
``/run/resident/localcluster/host.json``: the sysctl values, the iptables rules and
chains, and which cgroups and mounts exist. The PIDs of the processes started are added
as they start. :func:`restore` then undoes the difference: it stops recorded processes
that still run (checking their command line, so a reused PID is never hit), unmounts
every mount that appeared under the node's directories (deepest first), deletes the
iptables rules and chains that were added, removes new ``kubepods`` cgroups, writes the
sysctls back, and finally deletes the record. If a run dies before its teardown, the
record stays, and the next start (or ``python -m localcluster.teardown``) restores from
it, so the true originals are never lost.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel, Field

from . import network

log = logging.getLogger(__name__)

RECORD = Path("/run/resident/localcluster/host.json")
NODE_LOCK = Path("/run/resident/localcluster/node.lock")   # held by a running LocalCluster
KUBELET_SYSCTLS = (
    "vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
)
IPTABLES = (("iptables", ("filter", "nat", "mangle")), ("ip6tables", ("filter", "nat", "mangle")))
CGROUP_ROOT = Path("/sys/fs/cgroup")
# kubelet's Pod cgroups; further nodes keep theirs below a cgroup root of their own
NODE_CGROUPS = "resident-nodes"    # the parent of every further node's cgroup root
CGROUP_NAMES = ("kubepods", "kubepods.slice", NODE_CGROUPS)


class RecordedProcess(BaseModel):
    pid: int
    argv0: str
    name: str


class HostRecord(BaseModel):
    """The machine's state before the node started, and what the node started."""

    sysctls: dict[str, str]
    iptables_rules: dict[str, list[str]]       # "iptables/nat" -> lines of `iptables -S`
    cgroups: list[str]
    mounts: list[str]
    managed_prefixes: list[str]
    processes: list[RecordedProcess] = Field(default_factory=list)
    # processes that name one of these addresses in their argv belong to a node too (containerd shims)
    runtime_addresses: list[str] = Field(default_factory=list)
    scratch_dirs: list[str] = Field(default_factory=list)
    # the cluster network's links and namespaces ("netns:<name>"), named before they are made
    network: list[str] = Field(default_factory=list)
    taken_by_pid: int

    def save(self, path: Path = RECORD) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")
        tmp.write_text(self.model_dump_json(indent=1))
        tmp.rename(path)

    @classmethod
    def load(cls, path: Path = RECORD) -> "HostRecord | None":
        if not path.exists():
            return None
        return cls.model_validate_json(path.read_text())

    def add_process(self, name: str, proc: subprocess.Popen, path: Path = RECORD) -> None:
        argv = [str(a) for a in proc.args]
        if argv[0] == "nsenter":   # nsenter execs the command: that is what runs under this PID
            argv = argv[argv.index("--") + 1:]
        self.processes.append(RecordedProcess(pid=proc.pid, argv0=argv[0], name=name))
        self.save(path)


# -- reading the machine ---------------------------------------------------------------
def read_sysctls() -> dict[str, str]:
    values = {}
    for key in KUBELET_SYSCTLS:
        try:
            values[key] = (Path("/proc/sys") / key).read_text().strip()
        except OSError:
            pass
    return values


def iptables_rules() -> dict[str, list[str]]:
    rules = {}
    for binary, tables in IPTABLES:
        for table in tables:
            proc = subprocess.run([binary, "-w", "5", "-t", table, "-S"], capture_output=True, text=True)
            if proc.returncode == 0:
                rules[f"{binary}/{table}"] = proc.stdout.splitlines()
    return rules


def kubepods_cgroups() -> list[str]:
    if not CGROUP_ROOT.is_dir():
        return []
    found = []
    for hierarchy in CGROUP_ROOT.iterdir():
        for name in CGROUP_NAMES:
            if (hierarchy / name).is_dir():
                found.append(str(hierarchy / name))
    return sorted(found)


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape") if "\\" in field else field


def mount_points() -> list[str]:
    """Mount points from /proc/self/mountinfo (os.path.ismount misses same-fs bind mounts)."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.append(_unescape(fields[4]))
    return points


def mounts_under(prefixes: list[str]) -> list[str]:
    """Mount points at or below any of ``prefixes``, deepest first (as many times as stacked)."""
    def inside(point: str) -> bool:
        return any(point == p or point.startswith(p.rstrip("/") + "/") for p in prefixes)

    return sorted((m for m in mount_points() if inside(m)), key=lambda m: (m.count("/"), m), reverse=True)


def take_record(managed_prefixes: list[str], path: Path = RECORD) -> HostRecord:
    record = HostRecord(sysctls=read_sysctls(), iptables_rules=iptables_rules(), cgroups=kubepods_cgroups(),
                        mounts=mounts_under(managed_prefixes), managed_prefixes=managed_prefixes,
                        taken_by_pid=os.getpid())
    record.save(path)
    return record


# -- undoing the difference ------------------------------------------------------------
def leftovers(record: HostRecord) -> list[str]:
    """What differs from the record (empty when the machine is as it was)."""
    found = []
    current = read_sysctls()
    found += [f"sysctl {k}={current.get(k)} (was {v})" for k, v in record.sysctls.items() if current.get(k) != v]
    found += [f"mount {m}" for m in mounts_under(record.managed_prefixes) if m not in record.mounts]
    rules = iptables_rules()
    for table, lines in rules.items():
        found += [f"{table}: {line}" for line in lines if line not in record.iptables_rules.get(table, [])]
    found += [f"cgroup {c}" for c in kubepods_cgroups() if c not in record.cgroups]
    found += network.leftovers(record.network)
    found += [f"pod network namespace file {f}" for f in network.pod_namespace_files()]
    found += [f"process {p.name} pid {p.pid}" for p in record.processes if _is_running(p)]
    found += [f"process {p.argv0} pid {p.pid}" for p in runtime_helpers(record.runtime_addresses)
              if _is_running(p)]
    return found


def _is_running(p: RecordedProcess) -> bool:
    try:
        stat = Path(f"/proc/{p.pid}/stat").read_text()
        argv0 = Path(f"/proc/{p.pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state != "Z" and argv0 == p.argv0


def runtime_helpers(addresses: list[str]) -> list[RecordedProcess]:
    """Processes whose argv names one of ``addresses`` (shims of a containerd that may be gone)."""
    wanted = {a.encode() for a in addresses}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted & set(argv):
            found.append(RecordedProcess(pid=int(entry.name), argv0=argv[0].decode(errors="replace"), name="shim"))
    return found


def stop_processes(record: HostRecord, timeout: float = 10.0) -> None:
    alive = [p for p in reversed(record.processes) if _is_running(p)]
    alive += runtime_helpers(record.runtime_addresses)
    for p in alive:
        log.warning("stopping leftover %s (pid %d)", p.name, p.pid)
        _signal(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _is_running(p)]
        time.sleep(0.1)
    for p in alive:
        _signal(p.pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def unmount_new(record: HostRecord) -> None:
    """Unmount what appeared under the managed prefixes, deepest first."""
    for _ in range(5):   # stacked mounts of one point show up again after each pass
        new = [m for m in mounts_under(record.managed_prefixes) if m not in record.mounts]
        if not new:
            return
        for point in new:
            proc = subprocess.run(["umount", point], capture_output=True, text=True)
            if proc.returncode != 0 and "not mounted" not in proc.stderr:
                log.warning("umount %s failed (%s); detaching it lazily", point, proc.stderr.strip())
                subprocess.run(["umount", "-l", point], capture_output=True)


def remove_iptables_additions(record: HostRecord) -> None:
    for table_key, lines in iptables_rules().items():
        binary, table = table_key.split("/")
        before = set(record.iptables_rules.get(table_key, []))
        added = [line for line in lines if line not in before]
        for line in (x for x in added if x.startswith("-A ")):
            subprocess.run([binary, "-w", "5", "-t", table, "-D", *shlex.split(line)[1:]], capture_output=True)
        for line in (x for x in added if x.startswith("-N ")):
            chain = line.split()[1]
            subprocess.run([binary, "-w", "5", "-t", table, "-F", chain], capture_output=True)
            subprocess.run([binary, "-w", "5", "-t", table, "-X", chain], capture_output=True)


def kill_pod_processes(record: HostRecord, timeout: float = 5.0) -> None:
    """SIGKILL what still runs in cgroups the node created: containers whose runtime is gone."""
    def pids() -> set[int]:
        found = set()
        for top in kubepods_cgroups():
            if top in record.cgroups:
                continue
            for dirpath, _, files in os.walk(top):
                if "cgroup.procs" in files:
                    try:
                        found |= {int(x) for x in Path(dirpath, "cgroup.procs").read_text().split()}
                    except OSError:
                        pass
        return found

    deadline = time.monotonic() + timeout
    while (left := pids()) and time.monotonic() < deadline:
        for pid in left:
            log.warning("killing leftover container process %d", pid)
            _signal(pid, signal.SIGKILL)
        time.sleep(0.2)


def remove_new_cgroups(record: HostRecord) -> None:
    for top in kubepods_cgroups():
        if top in record.cgroups:
            continue
        for dirpath, dirnames, _ in sorted(os.walk(top), key=lambda w: w[0].count("/"), reverse=True):
            try:
                os.rmdir(dirpath)
            except OSError as e:
                log.warning("cannot remove cgroup %s: %s", dirpath, e)


def restore_sysctls(record: HostRecord) -> None:
    for key, value in record.sysctls.items():
        path = Path("/proc/sys") / key
        if path.read_text().strip() != value:
            path.write_text(value)


def restore(record: HostRecord, path: Path = RECORD) -> list[str]:
    """Undo everything the record does not show; return what could not be undone."""
    stop_processes(record)
    kill_pod_processes(record)
    network.remove(record.network)
    unmount_new(record)
    network.remove_pod_namespace_files()
    remove_iptables_additions(record)
    remove_new_cgroups(record)
    restore_sysctls(record)
    for scratch in record.scratch_dirs:
        if not mounts_under([scratch]):      # never delete through a mount point
            shutil.rmtree(scratch, ignore_errors=True)
    remaining = leftovers(record)
    if remaining:
        log.error("could not restore the machine completely", extra={"leftovers": remaining})
    else:
        path.unlink(missing_ok=True)
    return remaining


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m localcluster.teardown", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", type=Path, default=RECORD, help="the host record to restore from")
    args = parser.parse_args(argv)
    from bundle.jsonlog import configure

    configure(logging.INFO)
    record = HostRecord.load(args.record)
    if record is None:
        print(f"no host record at {args.record}: nothing to restore")
        return 0
    NODE_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(NODE_LOCK, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"a LocalCluster is running (it holds {NODE_LOCK}); stop it instead", file=sys.stderr)
            return 2
        remaining = restore(record, args.record)
    for item in remaining:
        print(f"left behind: {item}")
    return 1 if remaining else 0


if __name__ == "__main__":
    sys.exit(main())
