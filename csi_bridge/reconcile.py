"""Start-up reconciliation: make the recorded state, the volume directories and
``/proc/self/mountinfo`` agree again after a restart or a crash.

For each recorded publication:
- ``published`` with an intact read-only bind mount: re-adopted as it is.
- ``published`` whose mount is gone or read-write while its target still exists (a node
  reboot, or a mount removed behind the bridge's back): mounted again, read-only.
- ``publishing`` (the bridge died mid-publish): finished if its read-only mount is
  already verified, otherwise rolled back to "not mounted": a half-made read-write bind
  is unmounted and scratch (``.incoming``) is removed. The record and its lease are kept
  so kubelet's retry completes the publish (or its unpublish releases it).
- ``unpublishing`` (the bridge died mid-unpublish): the unpublish is finished.

Deliveries caught in ``staging`` get their scratch removed; the BundleDelivery watch
stages them again. A volume directory with no record and no mount is deleted (it can only
be left by a crash after its record was removed). Nothing here ever releases a lease
because something failed: errors are logged and the record is left for the next pass.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import mountinfo, mounts, volumes
from .publisher import Publisher
from .state import BridgeState

log = logging.getLogger("resident.bridge.reconcile")


@dataclass
class Report:
    adopted: list[str] = field(default_factory=list)
    remounted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    unpublished: list[str] = field(default_factory=list)
    orphans_removed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def reconcile(publisher: Publisher, state: BridgeState, volumes_root: Path) -> Report:
    report = Report()
    for rec in state.publications():
        vdir, target = Path(rec.volume_dir), Path(rec.target_path)
        try:
            volumes.clear_incoming(vdir)
            intact = _intact(vdir, target)
            if rec.state == "unpublishing":
                publisher.finish_unpublish(rec)
                report.unpublished.append(rec.target_path)
            elif rec.state == "published" and intact:
                report.adopted.append(rec.target_path)
            elif rec.state == "published":
                if target.is_dir():
                    publisher.complete(rec)
                    report.remounted.append(rec.target_path)
                else:
                    log.warning("published volume has no target; waiting for unpublish",
                                extra={"volume": rec.volume_id, "target": rec.target_path})
            elif intact:
                state.set_publication_state(rec.target_path, "published")
                report.finished.append(rec.target_path)
            else:
                if mounts.shows(vdir, target):
                    mounts.unmount_all(target)
                report.rolled_back.append(rec.target_path)
        except Exception as e:  # keep going; the record and lease stay as they are
            report.errors.append(f"{rec.target_path}: {e}")
            log.error("reconcile failed", extra={"target": rec.target_path, "error": str(e)})
    for d in state.deliveries():
        if d.state == "staging":
            pub = state.publication(d.target_path)
            if pub is not None:
                try:
                    volumes.clear_incoming(Path(pub.volume_dir))
                except OSError as e:
                    report.errors.append(f"delivery {d.uid}: {e}")
    known = {Path(r.volume_dir).name for r in state.publications()}
    if Path(volumes_root).is_dir():
        for entry in os.scandir(volumes_root):
            if entry.is_dir(follow_symlinks=False) and entry.name not in known:
                try:
                    if volumes.remove(Path(entry.path)):
                        report.orphans_removed.append(entry.name)
                except OSError as e:
                    report.errors.append(f"orphan {entry.name}: {e}")
    log.info("reconciled", extra={"phase": {k: len(v) for k, v in report.__dict__.items()}})
    return report


def _intact(vdir: Path, target: Path) -> bool:
    m = mountinfo.mount_at(target)
    return (m is not None and m.read_only and mounts.shows(vdir, target)
            and volumes.current_digest(vdir) is not None)
