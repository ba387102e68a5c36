"""Python stubs for the bridge's protos, generated with grpcio-tools.

The ``.proto`` files in ``csi_bridge/proto/`` are the source of truth; the ``*_pb2.py``
and ``*_pb2_grpc.py`` modules beside them are generated from them and checked in, so the
runtime needs only grpcio and protobuf. Protos are compiled with the repository root as
the include path, which makes the generated gRPC modules import their message modules as
``csi_bridge.proto.<name>_pb2`` (no ``sys.path`` tricks). A test regenerates the stubs
into a temporary directory and compares them byte for byte with the checked-in ones.

Run ``python -m csi_bridge.codegen`` after editing a proto.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
PROTO_DIR = PACKAGE_DIR / "proto"
PROTOS = ("csi.proto", "pluginregistration.proto")


def generated_names(proto: str) -> tuple[str, str]:
    stem = proto.removesuffix(".proto")
    return f"{stem}_pb2.py", f"{stem}_pb2_grpc.py"


def generate(out_root: Path) -> list[Path]:
    """Compile every proto into ``out_root/csi_bridge/proto/``; return the written files."""
    from grpc_tools import protoc  # build-time dependency only
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    out_root = Path(out_root)
    (out_root / "csi_bridge" / "proto").mkdir(parents=True, exist_ok=True)
    written = []
    for proto in PROTOS:
        rel = f"csi_bridge/proto/{proto}"
        rc = protoc.main(["grpc_tools.protoc", f"-I{REPO_ROOT}", f"-I{well_known}",
                          f"--python_out={out_root}", f"--grpc_python_out={out_root}", rel])
        if rc != 0:
            raise RuntimeError(f"protoc failed on {rel} with exit code {rc}")
        written += [out_root / "csi_bridge" / "proto" / n for n in generated_names(proto)]
    return written


def stale_files() -> list[str]:
    """Names of checked-in generated files that differ from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        return [p.name for p in fresh
                if not (PROTO_DIR / p.name).is_file()
                or (PROTO_DIR / p.name).read_bytes() != p.read_bytes()]


def main(argv: list[str] | None = None) -> int:
    """Regenerate the checked-in stubs in place."""
    generate(REPO_ROOT)
    print("generated:", ", ".join(n for p in PROTOS for n in generated_names(p)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
