"""Argument checks for every Node RPC, in one place, before any lookup or filesystem work.

Each check turns a raw protobuf request into a typed, validated value or raises
:class:`CsiError` carrying the gRPC status code the CSI spec asks for. The order
matters: the fields CSI marks required (``volume_id``, ``target_path``,
``volume_capability``) are checked first, then what this driver adds: only mount (not
block) volumes, only read-only publishes, and ``volumeAttributes`` that name a bundle
(``digest``, ``source``, optionally ``model``). Pod information from ``podInfoOnMount``
is carried along for authorization, and the publish ``secrets`` (the data of the Secret
the Pod's volume names in ``nodePublishSecretRef``) as the source's credentials, which
never appear in a message or a log line.
"""

from __future__ import annotations

import posixpath
import re

import grpc
from pydantic import BaseModel, ConfigDict, Field

from bundle.manifest import DIGEST_RE
from bundle.sources import SourceCredentials
from .proto import csi_pb2
from .status import CsiError

SOURCE_RE = re.compile(r"^(file|https?|oci|s3|hf)://.+")
POD_NAME = "csi.storage.k8s.io/pod.name"
POD_NAMESPACE = "csi.storage.k8s.io/pod.namespace"
POD_UID = "csi.storage.k8s.io/pod.uid"
EPHEMERAL = "csi.storage.k8s.io/ephemeral"
MAX_PATH = 4096
Mode = csi_pb2.VolumeCapability.AccessMode.Mode


def invalid(message: str) -> CsiError:
    return CsiError(grpc.StatusCode.INVALID_ARGUMENT, message)


class BundleRef(BaseModel):
    """The bundle a volume names, from its volumeAttributes."""

    model_config = ConfigDict(frozen=True)
    digest: str
    source: str
    model: str = ""


class PodRef(BaseModel):
    """The Pod a volume is mounted for (empty without podInfoOnMount)."""

    model_config = ConfigDict(frozen=True)
    namespace: str = ""
    name: str = ""
    uid: str = ""


class PublishArgs(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    volume_id: str
    target_path: str
    bundle: BundleRef
    pod: PodRef
    # the publish secrets; None when the volume names no Secret (kubelet sends none)
    credentials: SourceCredentials | None = Field(default=None, repr=False)


class UnpublishArgs(BaseModel):
    model_config = ConfigDict(frozen=True)
    volume_id: str
    target_path: str


class StatsArgs(BaseModel):
    model_config = ConfigDict(frozen=True)
    volume_id: str
    volume_path: str


def check_volume_id(volume_id: str) -> str:
    """CSI puts no limit on volume id characters; the bridge only needs it non-empty.

    It never becomes a path by itself (volume directories are named by a hash of the id
    and the target), so any string kubelet or a conformance suite sends is accepted.
    """
    if not volume_id:
        raise invalid("volume_id is required")
    if "\x00" in volume_id:
        raise invalid("volume_id must not contain NUL")
    return volume_id


def check_path(path: str, field: str) -> str:
    if not path:
        raise invalid(f"{field} is required")
    if not path.startswith("/") or "\x00" in path or len(path) > MAX_PATH:
        raise invalid(f"{field} {path[:200]!r} must be an absolute path without NUL")
    if posixpath.normpath(path) != path.rstrip("/") and path != "/":
        raise invalid(f"{field} {path[:200]!r} is not normalized")
    if path.rstrip("/") == "":
        raise invalid(f"{field} must not be the root directory")
    return path.rstrip("/")


def check_confined(path: str, pods_dir: str | None) -> None:
    """``path`` lies strictly under kubelet's pods directory once symlinks are resolved.

    kubelet only ever asks for targets under ``<kubelet root>/pods``; anything else (a
    node path such as /etc, or a symlink inside the pods directory that leads out of it)
    is refused before the bridge creates, mounts or removes anything there.
    """
    if pods_dir is None:
        return
    root = posixpath.realpath(pods_dir)
    if not posixpath.realpath(path).startswith(root.rstrip("/") + "/"):
        raise invalid(f"target_path {path[:200]!r} is outside kubelet's pods directory "
                      f"{pods_dir} (--pods-dir); refused")


def check_capability(req: csi_pb2.NodePublishVolumeRequest) -> None:
    if not req.HasField("volume_capability"):
        raise invalid("volume_capability is required")
    cap = req.volume_capability
    if cap.HasField("block"):
        raise invalid("block volumes are not supported: a bundle is published as a mount volume")
    if not cap.HasField("mount"):
        raise invalid("volume_capability must name an access type (mount)")
    if cap.access_mode.mode == Mode.UNKNOWN:
        raise invalid("volume_capability.access_mode is required")
    if "rw" in cap.mount.mount_flags:
        raise invalid("mount flag 'rw' refused: bundles are published read-only")


def check_publish(req: csi_pb2.NodePublishVolumeRequest) -> PublishArgs:
    volume_id = check_volume_id(req.volume_id)
    target = check_path(req.target_path, "target_path")
    check_capability(req)
    if not req.readonly:
        raise invalid("writable publish refused: bundle volumes are read-only "
                      "(set readOnly: true on the csi volume)")
    ctx = dict(req.volume_context)
    digest, source = ctx.get("digest", ""), ctx.get("source", "")
    if not digest:
        raise invalid("volumeAttributes.digest is required (sha256:<64 hex>)")
    if not DIGEST_RE.match(digest):
        raise invalid(f"volumeAttributes.digest {digest[:80]!r} is not sha256:<64 lowercase hex>")
    if not source:
        raise invalid("volumeAttributes.source is required (file://, http(s)://, oci://, s3:// or hf://)")
    if not SOURCE_RE.match(source) or len(source) > 2048:
        raise invalid(f"volumeAttributes.source {source[:80]!r} must be a file://, http(s)://, "
                      "oci://, s3:// or hf:// URI of at most 2048 characters")
    if ctx.get(EPHEMERAL, "true").lower() == "false":
        raise invalid("only inline ephemeral volumes are supported "
                      f"({EPHEMERAL}=false); use a csi inline volume in the Pod spec")
    secrets = dict(req.secrets)
    return PublishArgs(volume_id=volume_id, target_path=target,
                       bundle=BundleRef(digest=digest, source=source, model=ctx.get("model", "")),
                       pod=PodRef(namespace=ctx.get(POD_NAMESPACE, ""), name=ctx.get(POD_NAME, ""),
                                  uid=ctx.get(POD_UID, "")),
                       credentials=SourceCredentials(secrets) if secrets else None)


def check_unpublish(req: csi_pb2.NodeUnpublishVolumeRequest) -> UnpublishArgs:
    return UnpublishArgs(volume_id=check_volume_id(req.volume_id),
                         target_path=check_path(req.target_path, "target_path"))


def check_stats(req: csi_pb2.NodeGetVolumeStatsRequest) -> StatsArgs:
    """Only presence is checked: a path the bridge never published is NOT_FOUND, as CSI asks."""
    volume_id = check_volume_id(req.volume_id)
    if not req.volume_path:
        raise invalid("volume_path is required")
    return StatsArgs(volume_id=volume_id, volume_path=req.volume_path)
