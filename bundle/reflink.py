"""Sharing bytes between files without writing them: reflink clones, with a copy fallback.

On XFS (``mkfs.xfs -m reflink=1``) and btrfs, the ``FICLONERANGE`` ioctl makes a range
of one file share the disk blocks of a range of another file; nothing is written until
one of them changes (copy on write). That is how a rebase reuses unchanged chunks of a
donor revision for free. Other filesystems (ext4, tmpfs) refuse the ioctl; there the
range is copied in the kernel with ``copy_file_range`` (still no userspace buffer, but
every byte is written).

The store probes its own directory once (:func:`supports_reflink`) instead of trusting
the filesystem's name, because XFS can be formatted without reflink.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from pathlib import Path

FICLONE = 0x40049409       # _IOW(0x94, 9, int)
FICLONERANGE = 0x4020940D  # _IOW(0x94, 13, struct file_clone_range)
BLOCK = 4096               # the block size clones are aligned to (XFS and btrfs here)
_REFUSED = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS,
            errno.EPERM}


def supports_reflink(directory: Path) -> bool:
    """Try a one-block clone between two probe files in ``directory``; clean up after."""
    src, dst = directory / ".reflink-probe-src", directory / ".reflink-probe-dst"
    try:
        with open(src, "w+b") as s:
            s.write(b"\xa5" * 4096)
            s.flush()
            with open(dst, "wb") as d:
                try:
                    fcntl.ioctl(d.fileno(), FICLONE, s.fileno())
                except OSError as e:
                    if e.errno in _REFUSED:
                        return False
                    raise
        return dst.read_bytes() == b"\xa5" * 4096
    finally:
        for p in (src, dst):
            p.unlink(missing_ok=True)


def clone_range(src_fd: int, src_offset: int, length: int, dst_fd: int, dst_offset: int) -> bool:
    """Share ``length`` bytes of src at ``src_offset`` into dst at ``dst_offset``.

    Returns False (nothing done) when the filesystem or the alignment refuses a clone;
    offsets must be block-aligned and the length too unless the range ends at src's EOF.
    """
    arg = struct.pack("qQQQ", src_fd, src_offset, length, dst_offset)
    try:
        fcntl.ioctl(dst_fd, FICLONERANGE, arg)
        return True
    except OSError as e:
        if e.errno in _REFUSED:
            return False
        raise


def copy_range(src_fd: int, src_offset: int, length: int, dst_fd: int, dst_offset: int) -> None:
    """Copy ``length`` bytes in the kernel; fall back to read/write where that is refused."""
    done = 0
    while done < length:
        try:
            n = os.copy_file_range(src_fd, dst_fd, length - done, src_offset + done,
                                   dst_offset + done)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            n = _copy_userspace(src_fd, src_offset + done, length - done, dst_fd, dst_offset + done)
        if n == 0:
            raise OSError(errno.EIO, f"source ended {length - done} bytes early while copying")
        done += n


def _copy_userspace(src_fd: int, src_offset: int, length: int, dst_fd: int, dst_offset: int) -> int:
    done = 0
    while done < length:
        block = os.pread(src_fd, min(length - done, 1 << 20), src_offset + done)
        if not block:
            break
        os.pwrite(dst_fd, block, dst_offset + done)
        done += len(block)
    return done


def share_or_copy(src_fd: int, src_offset: int, length: int, dst_fd: int, dst_offset: int,
                  reflink: bool) -> bool:
    """Clone if ``reflink`` and the kernel agrees, else copy. True if the range was cloned.

    A range that starts or ends off a block boundary (chunks cut at tensors,
    :mod:`bundle.chunking`) has its whole blocks cloned and the bytes on either side of
    them, less than a block each, copied: that too counts as cloned."""
    if reflink and clone_range(src_fd, src_offset, length, dst_fd, dst_offset):
        return True
    head = -src_offset % BLOCK
    middle = (length - head) // BLOCK * BLOCK if length > head else 0
    if (reflink and middle and (head or middle < length) and (dst_offset + head) % BLOCK == 0
            and clone_range(src_fd, src_offset + head, middle, dst_fd, dst_offset + head)):
        copy_range(src_fd, src_offset, head, dst_fd, dst_offset)
        done = head + middle
        copy_range(src_fd, src_offset + done, length - done, dst_fd, dst_offset + done)
        return True
    copy_range(src_fd, src_offset, length, dst_fd, dst_offset)
    return False
