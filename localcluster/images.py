"""Images for the local cluster, with no registry: built here, cached by content, imported.

Images, each an OCI image-layout tarball (:mod:`localcluster.oci_layout`) that
:meth:`localcluster.node.LocalCluster.import_image` hands to ``ctr images import``:

- **pause** (``resident.local/pause:<hash>``): the Pod sandbox. One layer with Debian's
  ``busybox-static`` and a shell loop that exits on TERM. Keyed by the busybox binary.
- **project** (``resident.local/resident:<hash>``): operator, bridge and owner in one
  image, run as ``resident <command>``. Two layers: a Debian base with Python and the
  PyPI dependencies (:mod:`localcluster.rootfs`, keyed by the Debian package list, the
  dpkg filters and the dependency list), and the project's wheel
  (:mod:`localcluster.wheel_layer`, keyed by the tree digest). A changed tree rebuilds
  only the small second layer; an unchanged tree rebuilds nothing.
- **owner-torch** (``resident.local/owner-torch:<hash>``), built only when asked for: the
  project image with the torch backend for the CPU in a layer between base and wheel
  (:mod:`localcluster.torch_layer`, keyed by the base, the ``torch-deps`` extra and
  ``torch-cpu.txt``), for owners with ``runtime.backend: torch``. Its layers and images are
  pruned apart from the project's, so building it never evicts a base layer.

Everything lives under ``<cache>/images`` (``/var/cache/resident/images``), written to
temporary names and renamed into place, and built under a file lock so two test sessions
on one machine do not build the same thing twice. ``python -m localcluster.images --help``
builds them from the command line.

This is also the recipe users install from (``scripts/images --out DIR``, README "Install
on a cluster"): a layout tarball is an OCI archive that any registry client pushes
(``skopeo copy oci-archive:DIR/resident.tar docker://REGISTRY/resident:TAG``), so the image
on a user's cluster is byte for byte the one the e2e tests and the demo run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from .binaries import apt_install
from .gobuild import build_lock, cache_root
from .oci_layout import ContainerConfig, Layer, image_manifest, pack_layer, write_image_layout
from .rootfs import DEBIAN_PACKAGES, DPKG_OPTIONS, MIRROR, SUITE, USER_ID, VENV, build_rootfs_tar, python_requirements
from .torch_layer import PINS, build_torch_layer_tar, torch_pins, torch_requirements
from .wheel_layer import build_wheel, project_files, tree_digest, wheel_layer_tar

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
RECIPE = "3"          # bump when the way images are built changes
BUSYBOX = Path("/bin/busybox")
BUSYBOX_APPLETS = ("sh", "sleep", "cat", "ls", "echo", "true", "false", "env", "id", "ps", "kill", "mount", "test")
PAUSE_COMMAND = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]
IMAGE_PACKAGES = ("mmdebstrap", "busybox-static", "git")
KEEP_PROJECT_IMAGES = 3
KEEP_TORCH_IMAGES = 2   # owner-torch images and torch layers, each counted apart from the above
PROJECT_PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def images_dir() -> Path:
    return cache_root() / "images"


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


# -- pause -----------------------------------------------------------------------------
def pause_image(cache: Path | None = None) -> tuple[str, Path]:
    """The sandbox image: (name, layout tarball). Built once per busybox binary."""
    cache = cache or images_dir()
    apt_install(("busybox-static",))
    key = _key(RECIPE, hashlib.sha256(BUSYBOX.read_bytes()).hexdigest(), BUSYBOX_APPLETS, PAUSE_COMMAND)
    name, out = f"resident.local/pause:{key}", cache / f"pause-{key}.oci.tar"
    if out.exists():
        return name, out
    with build_lock(cache), tempfile.TemporaryDirectory(prefix="resident-pause-", dir=cache) as tmp:
        if out.exists():
            return name, out
        layer_tar = Path(tmp) / "layer.tar"
        with tarfile.open(layer_tar, "w", format=tarfile.PAX_FORMAT) as tar:
            for directory in ("bin", "dev", "etc", "proc", "sys", "tmp"):
                info = tarfile.TarInfo(directory)
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755, 0
                tar.addfile(info)
            info = tar.gettarinfo(str(BUSYBOX), "bin/busybox")
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            with open(BUSYBOX, "rb") as f:
                tar.addfile(info, f)
            for applet in BUSYBOX_APPLETS:
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type, link.linkname, link.mode, link.mtime = tarfile.SYMTYPE, "busybox", 0o777, 0
                tar.addfile(link)
        layer = pack_layer(layer_tar, Path(tmp) / "layer.tar.gz")
        write_image_layout(out, name, [layer], ContainerConfig(env=["PATH=/bin"], entrypoint=PAUSE_COMMAND))
    log.info("built pause image", extra={"image": name, "tarball": str(out)})
    return name, out


# -- static binaries -------------------------------------------------------------------
def static_image(kind: str, binaries: dict[str, Path], entrypoint: list[str], cache: Path | None = None,
                 user: str = "65532:65532") -> tuple[str, Path]:
    """An image of static binaries only (``/usr/local/bin/<name>``), run as ``user``, for the
    cluster's Go parts (CoreDNS, the CSI sidecars): (name, layout tarball). Keyed by the
    binaries' bytes."""
    cache = cache or images_dir()
    digests = {n: hashlib.sha256(Path(b).read_bytes()).hexdigest() for n, b in sorted(binaries.items())}
    key = _key(RECIPE, kind, digests, entrypoint, user)
    name, out = f"resident.local/{kind}:{key}", cache / f"{kind}-{key}.oci.tar"
    if out.exists():
        return name, out
    with build_lock(cache), tempfile.TemporaryDirectory(prefix=f"resident-{kind}-", dir=cache) as tmp:
        if out.exists():
            return name, out
        layer_tar = Path(tmp) / "layer.tar"
        with tarfile.open(layer_tar, "w", format=tarfile.PAX_FORMAT) as tar:
            for directory in ("etc", "tmp", "usr", "usr/local", "usr/local/bin"):
                info = tarfile.TarInfo(directory)
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755, 0
                tar.addfile(info)
            for binary_name, path in sorted(binaries.items()):
                info = tar.gettarinfo(str(path), f"usr/local/bin/{binary_name}")
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mode, info.mtime = 0o755, 0
                with open(path, "rb") as f:
                    tar.addfile(info, f)
        layer = pack_layer(layer_tar, Path(tmp) / "layer.tar.gz")
        write_image_layout(out, name, [layer], ContainerConfig(env=["PATH=/usr/local/bin"], entrypoint=entrypoint,
                                                               user=user))
    log.info("built image", extra={"image": name, "tarball": str(out)})
    return name, out


# -- project ---------------------------------------------------------------------------
def _pip() -> Path:
    return Path(sys.executable).with_name("pip")


def base_key(repo: Path = REPO) -> str:
    requirements = python_requirements(repo / "pyproject.toml")
    return _key(RECIPE, SUITE, MIRROR, DEBIAN_PACKAGES, DPKG_OPTIONS, USER_ID, requirements, sys.version_info[:2])


def _base_layer(repo: Path, cache: Path) -> tuple[Layer, dict]:
    key = base_key(repo)
    meta = cache / f"base-{key}.json"
    if meta.exists():
        doc = json.loads(meta.read_text())
        return Layer.from_json(doc["layer"]), doc["facts"]
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="resident-base-", dir=cache) as tmp:
        rootfs_tar = Path(tmp) / "rootfs.tar"
        facts = build_rootfs_tar(rootfs_tar, python_requirements(repo / "pyproject.toml"), _pip())
        layer = pack_layer(rootfs_tar, cache / f"base-{key}.tar.gz")
    _write_meta(meta, {"layer": layer.to_json(), "facts": facts})
    log.info("built base layer", extra={"key": key, "bytes": layer.size, "seconds": round(time.monotonic() - began, 1)})
    return layer, facts


def _prune(cache: Path, keep: set[str], keep_base: str) -> None:
    """Keep the newest project images (and their layers) and base layers; delete older ones."""
    _prune_layers(cache, "base", keep_base, 2)
    _prune_images(cache, "resident", ("app",), keep, KEEP_PROJECT_IMAGES)


def _prune_layers(cache: Path, kind: str, keep: str, count: int) -> None:
    """Keep the ``count`` newest ``<kind>-<key>.tar.gz`` layers (and their .json), and ``keep``."""
    layers = sorted(cache.glob(f"{kind}-*.tar.gz"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in layers[count:]:
        key = old.name[len(kind) + 1:-len(".tar.gz")]
        if key != keep:
            old.unlink(missing_ok=True)
            (cache / f"{kind}-{key}.json").unlink(missing_ok=True)


def _prune_images(cache: Path, kind: str, layers: tuple[str, ...], keep: set[str], count: int) -> None:
    """Keep the ``count`` newest ``<kind>-<key>.oci.tar`` (and their ``<layer>-<key>`` files)."""
    layouts = sorted(cache.glob(f"{kind}-*.oci.tar"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in layouts[count:]:
        key = old.name[len(kind) + 1:-len(".oci.tar")]
        if key in keep:
            continue
        old.unlink(missing_ok=True)
        for layer in layers:
            for suffix in (".tar.gz", ".json"):
                (cache / f"{layer}-{key}{suffix}").unlink(missing_ok=True)


def project_key(repo: Path = REPO) -> str:
    """The image's content hash: the base layer's key and the project tree's digest."""
    return _key(RECIPE, base_key(repo), tree_digest(repo, project_files(repo)))


def _app_layer(repo: Path, cache: Path, key: str, facts: dict) -> Layer:
    """The project's wheel as a layer (cached per project key)."""
    meta = cache / f"app-{key}.json"
    if cached := _cached_layer(meta):
        return cached
    with tempfile.TemporaryDirectory(prefix="resident-app-", dir=cache) as tmp:
        wheel = build_wheel(repo, project_files(repo), Path(tmp) / "wheel", _pip())
        app_tar = Path(tmp) / "app.tar"
        scripts = wheel_layer_tar(wheel, VENV, facts["purelib"], app_tar)
        if "resident" not in scripts:
            raise RuntimeError(f"the project wheel {wheel.name} has no 'resident' console script ({scripts})")
        app = pack_layer(app_tar, cache / f"app-{key}.tar.gz")
    _write_meta(meta, app.to_json())
    return app


def _cached_layer(meta: Path) -> Layer | None:
    """The layer ``meta`` describes, if both are still in the cache."""
    if not meta.exists():
        return None
    layer = Layer.from_json(json.loads(meta.read_text()))
    return layer if layer.path.exists() else None


def _write_meta(meta: Path, doc: dict) -> None:
    partial = meta.with_suffix(".json.partial")
    partial.write_text(json.dumps(doc, indent=1))
    partial.rename(meta)


def _project_config() -> ContainerConfig:
    # what the chart expects: the operator container passes only args (`operator ...`) to the
    # entrypoint; the bridge and the owners (the operator's Pods) name `resident ...` as their
    # command, found on PATH. The default user is the non-root `resident` (the chart's
    # operator.runAsUser; owner Pods set runAsNonRoot; the chart runs the bridge as root)
    return ContainerConfig(env=[f"PATH={PROJECT_PATH}", "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1"],
                           entrypoint=["resident"], cmd=["--help"], user=f"{USER_ID}:{USER_ID}")


def _image(cache: Path, kind: str, key: str, build) -> tuple[str, Path]:
    """``resident.local/<kind>:<key>`` and its layout tarball; ``build(name, out)`` writes it
    under the build lock unless the cache has it."""
    name, out = f"resident.local/{kind}:{key}", cache / f"{kind}-{key}.oci.tar"
    if out.exists():
        return name, out
    apt_install(IMAGE_PACKAGES)
    with build_lock(cache):
        if out.exists():
            return name, out
        began = time.monotonic()
        build(name, out)
    log.info("built image", extra={"image": name, "seconds": round(time.monotonic() - began, 1)})
    return name, out


def project_image(repo: Path = REPO, cache: Path | None = None) -> tuple[str, Path]:
    """The project image: (name, layout tarball). Rebuilt only when the tree changed."""
    cache = cache or images_dir()
    key = project_key(repo)

    def build(name: str, out: Path) -> None:
        base, facts = _base_layer(repo, cache)
        write_image_layout(out, name, [base, _app_layer(repo, cache, key, facts)], _project_config())
        _prune(cache, keep={key}, keep_base=base_key(repo))
    return _image(cache, "resident", key, build)


# -- owner-torch -----------------------------------------------------------------------
def torch_key(repo: Path = REPO) -> str:
    """The torch layer's key: the base it sits on, the ``torch-deps`` extra's requirements
    and the pins of ``torch-cpu.txt``."""
    return _key(RECIPE, base_key(repo), torch_requirements(repo / "pyproject.toml"), torch_pins(repo / PINS))


def _torch_layer(repo: Path, cache: Path, facts: dict) -> Layer:
    key = torch_key(repo)
    meta = cache / f"torch-{key}.json"
    if cached := _cached_layer(meta):
        return cached
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="resident-torch-", dir=cache) as tmp:
        layer_tar = Path(tmp) / "torch.tar"
        build_torch_layer_tar(layer_tar, torch_requirements(repo / "pyproject.toml"), torch_pins(repo / PINS),
                              facts["freeze"], facts["purelib"], _pip())
        # level 1: the layer is mostly compiled code that never leaves this machine
        layer = pack_layer(layer_tar, cache / f"torch-{key}.tar.gz", compresslevel=1)
    _write_meta(meta, layer.to_json())
    log.info("built torch layer", extra={"key": key, "bytes": layer.size, "seconds": round(time.monotonic() - began, 1)})
    return layer


def owner_torch_image(repo: Path = REPO, cache: Path | None = None) -> tuple[str, Path]:
    """The project image plus the torch extra, for owners with ``runtime.backend: torch``:
    (name, layout tarball). Built only when asked for; its torch layer has a cache slot of
    its own, so it never evicts the base layers the project image needs."""
    cache = cache or images_dir()
    key = _key(RECIPE, project_key(repo), torch_key(repo))
    project_image(repo, cache)   # its app layer is shared, and pruned with the project image

    def build(name: str, out: Path) -> None:
        base, facts = _base_layer(repo, cache)
        app = _app_layer(repo, cache, project_key(repo), facts)
        write_image_layout(out, name, [base, _torch_layer(repo, cache, facts), app], _project_config())
        _prune_images(cache, "owner-torch", (), {key}, KEEP_TORCH_IMAGES)
        _prune_layers(cache, "torch", torch_key(repo), KEEP_TORCH_IMAGES)
    return _image(cache, "owner-torch", key, build)


def cached_image_names(cache: Path | None = None) -> set[str]:
    """Names of the images whose tarballs the cache still holds (older ones were pruned)."""
    cache = cache or images_dir()
    names = set()
    for path in cache.glob("*.oci.tar"):      # <kind>-<key>.oci.tar; a kind may hold dashes
        kind, _, key = path.name[:-len(".oci.tar")].rpartition("-")
        names.add(f"resident.local/{kind}:{key}")
    return names


def clear_cache(cache: Path | None = None) -> None:
    """Delete every cached image and layer (the next build starts from Debian)."""
    cache = cache or images_dir()
    with build_lock(cache):
        for path in cache.iterdir():
            if path.name != ".build.lock":
                shutil.rmtree(path) if path.is_dir() else path.unlink()


ARCHIVE_NAMES = {"pause": "pause.tar", "project": "resident.tar", "owner-torch": "owner-torch.tar"}


def export_archive(tarball: Path, out_dir: Path, file_name: str) -> Path:
    """Copy a cached image's layout tarball to ``out_dir/file_name`` (atomically), for a
    registry client: the tarball is an OCI archive (``skopeo copy oci-archive:...``). A
    copy, not a link, so pruning the cache never changes what a user was handed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / file_name
    partial = out.with_name(out.name + ".partial")
    shutil.copyfile(tarball, partial)
    partial.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m localcluster.images", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clear", action="store_true", help="delete the image cache first (forces a cold build)")
    parser.add_argument("--only", choices=tuple(ARCHIVE_NAMES),
                        help="build just this image (owner-torch, the project image plus the torch extra"
                             " for the torch backend, is built only when named here)")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="write the image as an OCI archive into DIR for your registry: DIR/resident.tar"
                             " (with --only owner-torch: DIR/owner-torch.tar), then e.g. `skopeo copy"
                             " oci-archive:DIR/resident.tar docker://REGISTRY/resident:TAG`. Without --only,"
                             " --out builds the project image alone (pause is the local cluster's sandbox)")
    args = parser.parse_args(argv)
    from bundle.jsonlog import configure
    from tqdm import tqdm

    configure(logging.INFO)
    if args.clear:
        clear_cache()
    builds = {"pause": pause_image, "project": project_image, "owner-torch": owner_torch_image}
    labels = [args.only] if args.only else ["project"] if args.out else ["pause", "project"]
    report = {}
    for label in tqdm(labels, desc="images", unit="image"):
        began = time.monotonic()
        name, path = builds[label]()
        if args.out:
            path = export_archive(path, args.out, ARCHIVE_NAMES[label])
        report[label] = {"image": name, "tarball": str(path), "bytes": path.stat().st_size,
                         "manifest": image_manifest(path).digest, "seconds": round(time.monotonic() - began, 2)}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
