"""A bundle volume laid out on a local disk, the way the bridge publishes one.

For running an owner without the bridge (a benchmark, a component or cluster test): copy
(or hardlink) a bundle directory that holds its manifest into
``<volume>/revisions/sha256-<hex>/`` and, if asked, point ``current`` at it with a
relative symlink swapped in atomically. The manifest is re-read and the files are
checked against it, so a volume built this way passes the owner's own checks.

Part of the test seam (:mod:`testkit`), not of the owner: an owner in a Pod only reads the
volume the bridge published, and nothing the image runs lays one out itself.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from bundle.manifest import MANIFEST_NAME, revision_dirname
from bundle.scan import read_manifest


def stage_revision(volume: Path | str, bundle: Path | str, make_current: bool = False,
                   hardlink: bool = True) -> str:
    """Place ``bundle`` under ``volume/revisions``; return its digest."""
    volume, bundle = Path(volume), Path(bundle)
    manifest = read_manifest(bundle)
    digest = manifest.digest
    dest = volume / "revisions" / revision_dirname(digest)
    if not dest.exists():
        tmp = volume / "revisions" / f".staging-{revision_dirname(digest)}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for entry in manifest.files:
            src, dst = bundle / entry.path, tmp / entry.path
            dst.parent.mkdir(parents=True, exist_ok=True)
            if hardlink:
                try:
                    os.link(src, dst)
                    continue
                except OSError:
                    pass
            shutil.copyfile(src, dst)
        shutil.copyfile(bundle / MANIFEST_NAME, tmp / MANIFEST_NAME)
        os.rename(tmp, dest)
    if make_current:
        set_current(volume, digest)
    return digest


def set_current(volume: Path | str, digest: str) -> None:
    """Point ``volume/current`` at the revision ``digest`` (atomic rename of a new link)."""
    volume = Path(volume)
    tmp = volume / ".current.tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(f"revisions/{revision_dirname(digest)}", tmp)
    os.replace(tmp, volume / "current")
