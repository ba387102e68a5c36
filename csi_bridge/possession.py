"""Possession, not knowledge: a namespace mounts a bundle only once its own source served it.

Digests are not secret, and the node store shares content across namespaces. Namespace
authorization (:mod:`csi_bridge.authorization`) checks that a ResidentModel of the Pod's
namespace *declares* the digest and source; that alone would let a tenant copy another
tenant's digest with a bogus source into its own ResidentModel and be served from the
store. So before a publish is granted the bridge *proves* the namespace can read the
bundle itself: it fetches the manifest of digest D from the source the namespace named
and checks that its bytes hash to D (:meth:`bundle.sources.Source.fetch_manifest`).

A ``file://`` source is a path on the node as the bridge sees it. One inside the bridge's
own directories (its store holds every revision's manifest) or inside kubelet's pods
directory (other Pods' volumes) proves nothing and is refused.

A proof is recorded per (namespace, source, digest) in the bridge's SQLite state, so it
is asked of the source once, not on every Pod start, and survives restarts. It is not a
bypass: it grants nothing to another namespace or another source, and authorization
still runs before it on every new publication. A proof is never withdrawn: a source that
later stops serving D does not unmount or refuse what it once proved (the bytes are the
same; see docs/security.md).
"""

from __future__ import annotations

import logging
import os

from bundle.errors import BundleError
from bundle.manifest import ManifestError
from bundle.sources.file import dir_from_uri

log = logging.getLogger("resident.bridge.possession")


class NotProven(Exception):
    """The namespace's source did not serve the bundle's manifest; ``cause`` is the failure."""

    def __init__(self, message: str, cause: Exception):
        super().__init__(message)
        self.cause = cause


class Possession:
    def __init__(self, state, open_source, protected_dirs=()):
        self.state, self.open_source = state, open_source
        # node directories holding every tenant's bundles: no file:// proof from inside them
        self.protected = [os.path.realpath(d) for d in protected_dirs if d is not None]

    def prove(self, namespace: str, source: str, digest: str, credentials=None) -> bool:
        """Return True if already proven, False if proven now; raise NotProven otherwise.

        ``credentials`` are the publishing volume's own (a source that reads them proves
        only what the namespace's Secret lets it read)."""
        if self.state.proven(namespace, source, digest):
            return True
        self.refuse_protected(source, digest)
        try:
            src = self.open_source(source, credentials=credentials)
            try:
                src.fetch_manifest(digest)  # raises unless the bytes hash to `digest`
            finally:
                src.close()
        except (BundleError, ManifestError) as e:
            raise NotProven(f"source {source} did not serve the manifest of {digest}: {e}", e) from e
        self.state.record_proof(namespace, source, digest)
        log.info(f"possession proven: {source} serves {digest}",
                 extra={"namespace": namespace, "digest": digest})
        return False

    def refuse_protected(self, source: str, digest: str) -> None:
        """Raise NotProven if ``source`` lies in a node directory holding every tenant's bundles."""
        inside = self._protected_dir(source)
        if inside is not None:
            raise NotProven(f"source {source} lies in {inside}, which holds every namespace's "
                            "bundles on this node; it cannot show that the namespace may read "
                            f"{digest}", ManifestError(f"{source}: a protected node directory"))

    def _protected_dir(self, source: str) -> str | None:
        if not source.startswith("file:"):
            return None
        try:
            path = os.path.realpath(dir_from_uri(source))
        except ManifestError:
            return None  # not a usable file:// URI: opening the source says why
        return next((d for d in self.protected if path == d or path.startswith(d.rstrip("/") + "/")),
                    None)
