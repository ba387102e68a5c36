"""Scratch filesystems in loop files: where the store's tests and benchmarks run.

Reflink (XFS, ``mkfs.xfs -m reflink=1``), no reflink (ext4) and "disk full" (a tiny
filesystem) are properties of a real filesystem, so the store is exercised on real ones:
a sparse image file under /tmp, attached to a loop device, formatted and mounted under
/tmp. :func:`loop_filesystem` undoes all of it (unmount, detach, delete) on exit, also
when the body raised. Needs root.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

MKFS = {
    "xfs": ["mkfs.xfs", "-q", "-f", "-m", "reflink=1"],
    "xfs-noreflink": ["mkfs.xfs", "-q", "-f", "-m", "reflink=0"],
    "ext4": ["mkfs.ext4", "-q", "-F", "-E", "nodiscard", "-m", "0"],
}
MIN_SIZE = {"xfs": 320 << 20, "xfs-noreflink": 320 << 20, "ext4": 2 << 20}


def _run(*cmd: str) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
    return res.stdout.strip()


@contextlib.contextmanager
def loop_filesystem(kind: str, size_bytes: int, prefix: str = "resident-loopfs-") -> Iterator[Path]:
    """Yield the mount point of a fresh ``kind`` filesystem of ``size_bytes``."""
    if kind not in MKFS:
        raise ValueError(f"filesystem kind {kind!r} must be one of {', '.join(MKFS)}")
    size_bytes = max(size_bytes, MIN_SIZE[kind])
    work = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    image, mnt = work / "fs.img", work / "mnt"
    mnt.mkdir()
    device = None
    mounted = False
    try:
        with open(image, "wb") as f:
            f.truncate(size_bytes)
        _run(*MKFS[kind], str(image))
        device = _run("losetup", "--find", "--show", str(image))
        _run("mount", device, str(mnt))
        mounted = True
        yield mnt
    finally:
        busy = None
        if mounted:
            for attempt in range(10):
                res = subprocess.run(["umount", str(mnt)], capture_output=True, text=True)
                if res.returncode == 0:
                    break
                time.sleep(0.1 * (attempt + 1))
            else:  # something still holds a file open: detach lazily, then report it
                busy = res.stderr.strip()
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        if device:
            subprocess.run(["losetup", "-d", device], capture_output=True)
        image.unlink(missing_ok=True)
        if mnt.exists():
            mnt.rmdir()
        work.rmdir()
        if busy:
            raise RuntimeError(f"{mnt} was busy at cleanup (lazily unmounted): {busy}")
