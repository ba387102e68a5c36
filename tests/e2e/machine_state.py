"""The machine as the e2e tests read it, independently of localcluster.teardown: sysctls
kubelet changes, mounts, iptables rules, network links and namespaces, and whether a
process is alive."""

from __future__ import annotations

import subprocess
from pathlib import Path

KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops", "vm/panic_on_oom")


def sysctls() -> dict[str, str]:
    return {k: Path("/proc/sys", k).read_text().strip() for k in KUBELET_SYSCTLS}


def mounts_below(*prefixes: str) -> list[str]:
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [p for p in points if any(p == x or p.startswith(x + "/") for x in prefixes)]


def iptables_state() -> str:
    out = []
    for binary in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            out.append(subprocess.run([binary, "-w", "5", "-t", table, "-S"], capture_output=True, text=True).stdout)
    return "\n".join(out)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def network_state() -> dict[str, list[str]]:
    """The machine's links and network namespaces (names only)."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if line.strip())
    spaces = sorted(p.name for p in Path("/run/netns").iterdir()) if Path("/run/netns").is_dir() else []
    return {"links": names, "namespaces": spaces}
