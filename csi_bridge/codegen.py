"""Python stubs for the repository's protos, generated with grpcio-tools.

A proto folder (``csi_bridge/proto/`` for the bridge's CSI and plugin-registration
protos, ``localcluster/proto/`` for kubelet's device-plugin API that the local cluster's
test cards speak) holds ``.proto`` files, the source of truth, and beside them the
``*_pb2.py`` and ``*_pb2_grpc.py`` modules generated from them and checked in, so the
runtime needs only grpcio and protobuf. Protos are compiled with the repository root as
the include path, which makes a generated gRPC module import its message module by its
package path (``csi_bridge.proto.<name>_pb2``, no ``sys.path`` tricks). A test per folder
regenerates the stubs into a temporary directory and compares them byte for byte with the
checked-in ones.

Run ``python -m csi_bridge.codegen [FOLDER ...]`` after editing a proto (the folders are
relative to the repository root; the default is the bridge's own). The helper lives with
the bridge because the bridge came first; it imports nothing of the bridge, and the local
cluster uses it only at build and test time.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
BRIDGE_FOLDER = "csi_bridge/proto"
PROTO_DIR = REPO_ROOT / BRIDGE_FOLDER


def generated_names(proto: str) -> tuple[str, str]:
    stem = proto.removesuffix(".proto")
    return f"{stem}_pb2.py", f"{stem}_pb2_grpc.py"


def protos_in(folder: str) -> tuple[str, ...]:
    """The ``.proto`` files of a repository folder, sorted by name."""
    return tuple(sorted(p.name for p in (REPO_ROOT / folder).glob("*.proto")))


def generate(out_root: Path, folder: str = BRIDGE_FOLDER) -> list[Path]:
    """Compile every proto of ``folder`` into ``out_root/<folder>/``; return the written files."""
    from grpc_tools import protoc  # build-time dependency only
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    out_root = Path(out_root)
    (out_root / folder).mkdir(parents=True, exist_ok=True)
    protos = protos_in(folder)
    if not protos:
        raise FileNotFoundError(f"no .proto files in {REPO_ROOT / folder}")
    written = []
    for proto in protos:
        rel = f"{folder}/{proto}"
        rc = protoc.main(["grpc_tools.protoc", f"-I{REPO_ROOT}", f"-I{well_known}",
                          f"--python_out={out_root}", f"--grpc_python_out={out_root}", rel])
        if rc != 0:
            raise RuntimeError(f"protoc failed on {rel} with exit code {rc}")
        written += [out_root / folder / n for n in generated_names(proto)]
    return written


def stale_files(folder: str = BRIDGE_FOLDER, against: Path | None = None) -> list[str]:
    """Names of checked-in generated files of ``folder`` that differ from a fresh generation
    (compared with the files in ``against`` instead, when given)."""
    checked_in = Path(against) if against is not None else REPO_ROOT / folder
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp), folder)
        return [p.name for p in fresh
                if not (checked_in / p.name).is_file()
                or (checked_in / p.name).read_bytes() != p.read_bytes()]


def main(argv: list[str] | None = None) -> int:
    """Regenerate the checked-in stubs of each folder named (default: the bridge's) in place."""
    for folder in (argv or [BRIDGE_FOLDER]):
        folder = folder.rstrip("/")
        generate(REPO_ROOT, folder)
        print(f"generated in {folder}:", ", ".join(n for p in protos_in(folder) for n in generated_names(p)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
