"""oci:// sources and targets: a bundle as an OCI artifact in a distribution registry.

A pushed bundle is one OCI image manifest, tagged in the repository:

- its **config** blob is the bundle manifest, in canonical form, with media type
  ``application/vnd.resident.bundle.manifest.v1+json``. Its digest is therefore the
  bundle digest itself;
- one **layer** per file, in manifest order, whose digest is the file's sha256 (so a layer
  is the file's raw bytes, not a tarball), with media type
  ``application/vnd.resident.bundle.file.v1`` and annotations naming the path
  (``org.opencontainers.image.title``) and role (``dev.resident.role``).

Reading needs no tag: ``fetch_manifest(D)`` fetches blob ``D`` (the config) and checks
its sha256, and file bytes are Range GETs of ``/v2/<name>/blobs/sha256:<file sha256>``,
resumed after drops like the http source. The tag keeps the artifact referenced (so
registry garbage collection keeps its blobs) and lets :meth:`OciSource.resolve` find the
bundle digest a tag points at. A push without a tag uses ``sha256-<hex>`` of the bundle.
"""

from __future__ import annotations

from typing import Iterator

import requests
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import SourceUnavailable
from ..manifest import MAX_MANIFEST_BYTES, FileEntry, ManifestError, check_digest
from .oci_auth import Credentials, RegistryAuth
from .oci_registry import OCI_MANIFEST, Reference, Registry
from .publish import LocalBundle, Progress, open_bundle, send_contents
from .ranged import RangedReader, RetryPolicy
from .source import Source, check_range

CONFIG_TYPE = "application/vnd.resident.bundle.manifest.v1+json"
LAYER_TYPE = "application/vnd.resident.bundle.file.v1"
TITLE = "org.opencontainers.image.title"
ROLE = "dev.resident.role"
MONOLITHIC_MAX = 64 * 1024 * 1024  # larger blobs go up in PATCH chunks of this size


class Descriptor(BaseModel):
    """An OCI content descriptor (the fields bundles use; others are kept, not checked)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    media_type: str = Field(alias="mediaType")
    digest: str
    size: int = Field(ge=0)
    annotations: dict[str, str] | None = None


class ImageManifest(BaseModel):
    """An OCI image manifest, as pushed for a bundle and read back by :meth:`OciSource.resolve`."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    schema_version: int = Field(default=2, alias="schemaVersion")
    media_type: str = Field(default=OCI_MANIFEST, alias="mediaType")
    config: Descriptor
    layers: list[Descriptor]
    annotations: dict[str, str] | None = None


class OciSource(Source):
    scheme = "oci"

    def __init__(self, uri: str, policy: RetryPolicy | None = None,
                 credentials: Credentials | None = None) -> None:
        super().__init__(uri)
        self.ref = Reference.parse(uri)
        policy = policy or RetryPolicy()
        self.session = requests.Session()
        self.session.auth = RegistryAuth(credentials or Credentials.from_env(), policy.timeout)
        self.reader = RangedReader(self.session, policy, self.scheme)

    def manifest_bytes(self, digest: str) -> bytes:
        return self.reader.get_small(self.ref.blob_url(digest), MAX_MANIFEST_BYTES)

    def read(self, entry: FileEntry, offset: int, length: int) -> Iterator[bytes]:
        check_range(entry, offset, length)
        return self.reader.read(self.ref.blob_url("sha256:" + entry.sha256), offset, length,
                                entry.path, entry.sha256)

    def resolve(self, tag: str | None = None) -> str:
        """The bundle digest the tag (default: the URI's tag) points at."""
        tag = tag or self.ref.tag
        if not tag:
            raise SourceUnavailable(f"{self.uri}: no tag to resolve")
        url = self.ref.manifest_url(tag)
        body = self.reader.get_small(url, 4 * 1024 * 1024, headers={"Accept": OCI_MANIFEST})
        try:
            config = ImageManifest.model_validate_json(body).config
            digest = check_digest(config.digest)
        except (ValidationError, ManifestError) as e:
            raise SourceUnavailable(f"{url}: not an OCI image manifest ({e})") from None
        if config.media_type != CONFIG_TYPE:
            raise SourceUnavailable(f"{url}: config media type {config.media_type!r}, "
                                    "not a Resident bundle")
        return digest

    def close(self) -> None:
        self.session.close()


def artifact_manifest(bundle: LocalBundle) -> bytes:
    """The OCI image manifest that publishes ``bundle`` (config = bundle manifest, layers = files)."""
    doc = ImageManifest(
        config=Descriptor(mediaType=CONFIG_TYPE, digest=bundle.digest, size=len(bundle.manifest_bytes)),
        layers=[Descriptor(mediaType=LAYER_TYPE, digest="sha256:" + f.sha256, size=f.size,
                           annotations={TITLE: f.path, ROLE: f.role.value})
                for f in bundle.manifest.files],
        annotations={"dev.resident.bundle.digest": bundle.digest})
    return doc.model_dump_json(by_alias=True, exclude_none=True).encode()


def push_oci(bundle_dir, uri: str, progress: Progress | None = None,
             policy: RetryPolicy | None = None, part_size: int = MONOLITHIC_MAX,
             credentials: Credentials | None = None) -> str:
    """Publish a built bundle as an OCI artifact; return the bundle digest."""
    bundle = open_bundle(bundle_dir)
    ref = Reference.parse(uri)
    policy = policy or RetryPolicy()
    with requests.Session() as session:
        session.auth = RegistryAuth(credentials or Credentials.from_env(), policy.timeout)
        registry = Registry(ref, session, policy)
        send_contents(bundle, uri, "oci", progress, policy,
                      lambda e: registry.has_blob("sha256:" + e.sha256, e.size),
                      lambda e, parts: registry.upload_blob("sha256:" + e.sha256, parts), part_size)
        raw = bundle.manifest_bytes
        if not registry.has_blob(bundle.digest, len(raw)):
            policy.call(lambda: registry.upload_blob(bundle.digest, [raw]), "oci")
        tag = ref.tag or bundle.digest.replace(":", "-", 1)
        policy.call(lambda: registry.put_manifest(tag, artifact_manifest(bundle)), "oci")
    return bundle.digest

