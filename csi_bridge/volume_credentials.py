"""The credentials each published volume's source is read with, held in memory only.

A Pod whose model names a Secret (``spec.bundle.credentialsSecret``) carries it on its
bundle volume as ``nodePublishSecretRef``; kubelet reads the Secret with its own node
authorization and passes its data as the ``secrets`` of every NodePublishVolume. The
publish itself uses them to fetch and to prove possession. Later reads for the same
volume, the revisions a BundleDelivery stages into it, use what the last publish of that
volume brought, never anyone else's: credentials belong to the volume (its target path),
and hence to one Pod of one namespace.

They are never written anywhere: not in ``bridge.db``, not in a log line, not in a
message. So after a restart the bridge knows no volume's credentials until kubelet
publishes it again. The CSIDriver asks for that with ``requiresRepublish: true``: kubelet
calls NodePublishVolume again for every mounted volume at each sync of its Pod (about
once a minute), which also brings a rotated Secret's new data. Until then a delivery
whose source reads credentials waits (:meth:`VolumeCredentials.known` is False).
"""

from __future__ import annotations

import threading

from bundle.sources import SourceCredentials


class VolumeCredentials:
    """target path -> the credentials its last publish brought (None: it brought none)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_target: dict[str, SourceCredentials | None] = {}

    def remember(self, target_path: str, credentials: SourceCredentials | None) -> None:
        with self._lock:
            self._by_target[target_path] = credentials

    def forget(self, target_path: str) -> None:
        with self._lock:
            self._by_target.pop(target_path, None)

    def known(self, target_path: str) -> bool:
        """Has kubelet published this volume since the bridge started?"""
        with self._lock:
            return target_path in self._by_target

    def of(self, target_path: str) -> SourceCredentials | None:
        with self._lock:
            return self._by_target.get(target_path)
