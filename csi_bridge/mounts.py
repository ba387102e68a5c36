"""Read-only bind mounts made with the mount(2) system call.

A published volume is a bind mount of the volume directory onto kubelet's target path.
``MS_BIND`` ignores ``MS_RDONLY``, so making it read-only takes a second call,
``MS_REMOUNT|MS_BIND|MS_RDONLY``; the result is then confirmed in mountinfo (the bridge
never trusts that a flag was honoured). Unmounting retries a busy mount with
``MNT_DETACH`` only when asked, since a lazy unmount hides a mount that is still in use.

The bridge calls libc directly (ctypes) instead of spawning ``mount``: no dependency on
util-linux in the image, and errno comes back exactly.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path

from . import mountinfo

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MNT_DETACH = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_void_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)


class MountError(OSError):
    """A mount or unmount failed, or its result is not what was asked for."""


def _mount(source: str | None, target: str, flags: int) -> None:
    rc = _libc.mount(source.encode() if source else None, target.encode(), None, flags, None)
    if rc != 0:
        e = ctypes.get_errno()
        raise MountError(e, f"mount({source!r}, {target!r}, flags={flags:#x}): {os.strerror(e)}")


def bind_read_only(source: Path, target: Path, between=None) -> mountinfo.Mount:
    """Bind ``source`` onto ``target`` read-only and return the verified mountinfo entry.

    A remount changes only the mount it is applied to, not its copies in peer mount
    namespaces: under kubelet's Bidirectional pods dir, remounting the target read-only
    would leave the host's (and so the container runtime's) copy writable. So the source
    is first bound read-only at a private staging point next to it, and the target is a
    bind of that read-only mount: a new mount, and every propagated copy of it, inherits
    the flag. ``between`` is called after the target bind (a crash point).
    """
    staging = source.parent / f".{source.name}.ro"
    staging.mkdir(exist_ok=True)
    unmount_all(staging)
    try:
        _mount(str(source), str(staging), MS_BIND)
        _mount(None, str(staging), MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        _mount(str(staging), str(target), MS_BIND)
    finally:
        unmount_all(staging)
        staging.rmdir()
    if between is not None:
        between()
    try:
        _mount(None, str(target), MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        return verify_read_only_bind(source, target)
    except MountError:
        unmount(target)  # never leave a writable bind behind
        raise


def verify_read_only_bind(source: Path, target: Path) -> mountinfo.Mount:
    """Raise MountError unless ``target`` is a read-only mount showing ``source``'s tree."""
    m = mountinfo.mount_at(target)
    if m is None:
        raise MountError(errno.ENOENT, f"{target} is not a mount point")
    if not m.read_only:
        raise MountError(errno.EROFS, f"{target} is mounted but not read-only ({','.join(sorted(m.options))})")
    if not shows(source, target):
        raise MountError(errno.EXDEV, f"{target} is a mount of something other than {source}")
    return m


def shows(source: Path, target: Path) -> bool:
    """True when ``target`` is the same directory inode as ``source`` (a bind of it)."""
    try:
        a, b = os.stat(source), os.stat(target)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def unmount(target: Path, *, lazy_if_busy: bool = False) -> bool:
    """Unmount ``target``; False if it was not mounted. Busy mounts raise unless lazy."""
    if mountinfo.mount_at(target) is None:
        return False
    rc = _libc.umount2(str(target).encode(), 0)
    if rc != 0:
        e = ctypes.get_errno()
        if e == errno.EBUSY and lazy_if_busy:
            rc = _libc.umount2(str(target).encode(), MNT_DETACH)
            e = ctypes.get_errno()
        if rc != 0:
            raise MountError(e, f"umount({target!r}): {os.strerror(e)}")
    return True


def unmount_all(target: Path) -> int:
    """Unmount every mount stacked on ``target``; return how many were removed."""
    n = 0
    while mountinfo.mount_at(target) is not None:
        unmount(target)
        n += 1
        if n > 32:
            raise MountError(errno.ELOOP, f"{target}: more than 32 stacked mounts")
    return n
