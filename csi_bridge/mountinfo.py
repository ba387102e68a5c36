"""What is mounted where, read from ``/proc/self/mountinfo``.

``os.path.ismount`` compares device numbers of a path and its parent, so it misses a bind
mount of a directory onto another directory of the same filesystem, which is exactly what
the bridge makes. The kernel's mountinfo table lists every mount with its mount point, the
root of the mounted subtree and its per-mount options (``ro``/``rw``), so the bridge
reads it to know whether a target is mounted, by what, and read-only.

Line format (proc(5)): ``id parent major:minor root mountpoint options [optional...] -
fstype source superoptions``; paths escape space, tab, newline and backslash as octal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
_OCTAL = re.compile(r"\\([0-7]{3})")


class MountinfoError(ValueError):
    """A mountinfo line does not have the shape proc(5) describes."""


@dataclass(frozen=True)
class Mount:
    mount_id: int
    parent_id: int
    device: str          # "major:minor"
    root: str            # path inside the filesystem that is mounted here
    mount_point: str
    options: frozenset[str]
    fstype: str
    source: str

    @property
    def read_only(self) -> bool:
        return "ro" in self.options


def unescape(field: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_line(line: str) -> Mount:
    parts = line.split()
    try:
        sep = parts.index("-")
        return Mount(mount_id=int(parts[0]), parent_id=int(parts[1]), device=parts[2],
                     root=unescape(parts[3]), mount_point=unescape(parts[4]),
                     options=frozenset(parts[5].split(",")), fstype=parts[sep + 1],
                     source=unescape(parts[sep + 2]))
    except (ValueError, IndexError):
        raise MountinfoError(f"unparsable mountinfo line: {line!r}") from None


def parse(text: str) -> list[Mount]:
    return [parse_line(line) for line in text.splitlines() if line.strip()]


def read(path: Path = MOUNTINFO) -> list[Mount]:
    return parse(path.read_text())


def mount_at(target: str | Path, mounts: list[Mount] | None = None) -> Mount | None:
    """The topmost mount whose mount point is exactly ``target`` (None if not a mount point)."""
    target = str(target).rstrip("/") or "/"
    found = None
    for m in (read() if mounts is None else mounts):
        if m.mount_point == target:
            found = m  # later lines are mounted on top of earlier ones
    return found


def mounts_under(prefix: str | Path, mounts: list[Mount] | None = None) -> list[Mount]:
    """Mounts at or below ``prefix``, deepest first (the order to unmount them in)."""
    prefix = str(prefix).rstrip("/")
    hits = [m for m in (read() if mounts is None else mounts)
            if m.mount_point == prefix or m.mount_point.startswith(prefix + "/")]
    return sorted(hits, key=lambda m: m.mount_point.count("/"), reverse=True)
