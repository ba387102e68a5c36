"""OCI image layouts written by hand, so images reach containerd without any registry.

An OCI image is a content-addressed graph: an *index* names one *manifest* per image, a
manifest lists a *config* blob and the *layer* blobs, and every reference is the sha256 of
the referenced bytes. An image layout is that graph as files: ``oci-layout``,
``index.json`` and ``blobs/sha256/<hex>``. Packed into one tar, ``ctr images import``
takes it as is; the annotation ``io.containerd.image.name`` on the index entry gives the
image its name.

A layer is a gzip-compressed tar. Its *digest* is the sha256 of the compressed bytes (what
the manifest points at); its *diff_id* is the sha256 of the uncompressed tar (what the
config's ``rootfs`` lists, and what containerd checks after unpacking). :func:`pack_layer`
computes both in one streaming pass. Everything written here is deterministic: fixed
timestamps, sorted keys, so equal inputs give equal digests.
"""

from __future__ import annotations

import gzip
import io
import hashlib
import json
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel, ConfigDict, Field

CHUNK = 1 << 20
EPOCH = "1970-01-01T00:00:00Z"
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
NAME_ANNOTATION = "io.containerd.image.name"
# registry host (with a dot or a port), path components, and a tag; no digests
IMAGE_NAME = re.compile(r"^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


class OciLayoutError(ValueError):
    """An image name or an image layout that containerd would not accept."""


@dataclass(frozen=True)
class Layer:
    """A compressed layer blob on disk and its two digests."""

    path: Path
    digest: str      # sha256 of the gzip bytes
    diff_id: str     # sha256 of the uncompressed tar
    size: int        # bytes of the gzip blob

    def to_json(self) -> dict:
        return {"path": str(self.path), "digest": self.digest, "diff_id": self.diff_id, "size": self.size}

    @classmethod
    def from_json(cls, data: dict) -> "Layer":
        return cls(Path(data["path"]), data["digest"], data["diff_id"], int(data["size"]))


class ContainerConfig(BaseModel):
    """The part of the OCI image config that says how a container starts."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")
    env: list[str] = Field(default_factory=list, alias="Env")
    entrypoint: list[str] | None = Field(default=None, alias="Entrypoint")
    cmd: list[str] | None = Field(default=None, alias="Cmd")
    working_dir: str = Field(default="/", alias="WorkingDir")
    user: str | None = Field(default=None, alias="User")  # "uid:gid"; None: root


class _HashingWriter:
    """A write-only file object that hashes and counts what passes through it."""

    def __init__(self, out: BinaryIO):
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def pack_layer(tar_path: Path, out_path: Path, compresslevel: int = 6) -> Layer:
    """Gzip the layer tar ``tar_path`` into ``out_path`` (atomically) and return its digests."""
    if not tarfile.is_tarfile(tar_path):
        raise OciLayoutError(f"{tar_path} is not a tar archive; a layer must be one")
    tmp = out_path.with_name(out_path.name + ".partial")
    diff = hashlib.sha256()
    with open(tar_path, "rb") as src, open(tmp, "wb") as raw:
        sink = _HashingWriter(raw)
        with gzip.GzipFile(fileobj=sink, mode="wb", mtime=0, compresslevel=compresslevel) as gz:
            while chunk := src.read(CHUNK):
                diff.update(chunk)
                gz.write(chunk)
    tmp.rename(out_path)
    return Layer(out_path, f"sha256:{sink.sha.hexdigest()}", f"sha256:{diff.hexdigest()}", sink.size)


def check_image_name(name: str) -> str:
    if not IMAGE_NAME.match(name):
        raise OciLayoutError(
            f"bad image name {name!r}: want host/path:tag in lower case, e.g. resident.local/resident:0123abcd")
    return name


def _blob(data: bytes) -> tuple[str, bytes]:
    return f"sha256:{hashlib.sha256(data).hexdigest()}", data


def _json_bytes(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def image_documents(name: str, layers: list[Layer], container: ContainerConfig) -> tuple[dict, dict[str, bytes]]:
    """The index and the small blobs (config, manifest) of one image; pure."""
    check_image_name(name)
    if not layers:
        raise OciLayoutError("an image needs at least one layer")
    config = {
        "architecture": "amd64", "os": "linux", "created": EPOCH,
        "config": container.model_dump(by_alias=True, exclude_none=True),
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created": EPOCH, "created_by": "localcluster.oci_layout"} for _ in layers],
    }
    config_digest, config_bytes = _blob(_json_bytes(config))
    manifest = {
        "schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": layer.digest, "size": layer.size} for layer in layers],
    }
    manifest_digest, manifest_bytes = _blob(_json_bytes(manifest))
    index = {
        "schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [{
            "mediaType": MANIFEST_MEDIA_TYPE, "digest": manifest_digest, "size": len(manifest_bytes),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {NAME_ANNOTATION: name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]},
        }],
    }
    return index, {config_digest: config_bytes, manifest_digest: manifest_bytes}


def write_image_layout(out_path: Path, name: str, layers: list[Layer], container: ContainerConfig) -> Path:
    """Write one image as an OCI image-layout tarball at ``out_path`` (atomically)."""
    index, small_blobs = image_documents(name, layers, container)
    tmp = out_path.with_name(out_path.name + ".partial")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        def add_bytes(member: str, data: bytes) -> None:
            info = tarfile.TarInfo(member)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))

        add_bytes("oci-layout", _json_bytes({"imageLayoutVersion": "1.0.0"}))
        add_bytes("index.json", _json_bytes(index))
        for digest, data in small_blobs.items():
            add_bytes(f"blobs/sha256/{digest.split(':')[1]}", data)
        for layer in layers:
            info = tarfile.TarInfo(f"blobs/sha256/{layer.digest.split(':')[1]}")
            info.size, info.mode, info.mtime = layer.size, 0o644, 0
            with open(layer.path, "rb") as blob:
                tar.addfile(info, blob)
    tmp.rename(out_path)
    return out_path


def _read_index(tar: tarfile.TarFile, layout_tar: Path) -> dict:
    try:
        layout = json.load(tar.extractfile("oci-layout"))
        index = json.load(tar.extractfile("index.json"))
    except (KeyError, AttributeError, json.JSONDecodeError) as e:
        raise OciLayoutError(f"{layout_tar} is not an OCI image layout (oci-layout/index.json: {e})") from e
    if layout.get("imageLayoutVersion") != "1.0.0":
        raise OciLayoutError(f"{layout_tar}: unsupported imageLayoutVersion {layout.get('imageLayoutVersion')!r}")
    return index


def _open_layout(layout_tar: Path) -> tarfile.TarFile:
    if not Path(layout_tar).is_file():
        raise FileNotFoundError(f"image tarball {layout_tar} does not exist")
    if not tarfile.is_tarfile(layout_tar):
        raise OciLayoutError(f"{layout_tar} is not a tar archive, so not an OCI image layout")
    return tarfile.open(layout_tar)


def image_names(layout_tar: Path) -> list[str]:
    """The image names an image-layout tarball carries; a clear error if it is not one."""
    with _open_layout(layout_tar) as tar:
        index = _read_index(tar, layout_tar)
    names = [m.get("annotations", {}).get(NAME_ANNOTATION) for m in index.get("manifests", [])]
    if not names or None in names:
        raise OciLayoutError(f"{layout_tar}: every index entry needs the {NAME_ANNOTATION} annotation")
    return names


@dataclass(frozen=True)
class ImageManifest:
    """The one image of a layout tarball: its manifest's digest, the manifest and the config."""

    digest: str
    manifest: dict
    config: dict


def image_manifest(layout_tar: Path) -> ImageManifest:
    """Read the single image of an image-layout tarball (what a registry client pushes)."""
    with _open_layout(layout_tar) as tar:
        entries = _read_index(tar, layout_tar).get("manifests", [])
        if len(entries) != 1:
            raise OciLayoutError(f"{layout_tar}: want exactly one image in index.json, found {len(entries)}")

        def blob(digest: str) -> bytes:
            try:
                data = tar.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}").read()
            except (KeyError, AttributeError) as e:
                raise OciLayoutError(f"{layout_tar}: blob {digest} is missing") from e
            if f"sha256:{hashlib.sha256(data).hexdigest()}" != digest:
                raise OciLayoutError(f"{layout_tar}: blob {digest} does not match its digest")
            return data

        digest = entries[0]["digest"]
        manifest = json.loads(blob(digest))
        config = json.loads(blob(manifest["config"]["digest"]))
    return ImageManifest(digest, manifest, config)
