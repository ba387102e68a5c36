"""Revisions of a generated model, whatever its format: what both generators share.

The cpu backend's models (:mod:`bundle.cpu_model`) and the Hugging Face checkpoints for the
torch backend (:mod:`bundle.hf_demo`) are generated here, never downloaded, and derived
into revisions that model the three kinds of change a transition meets
(:data:`REVISION_KINDS`): ``rows`` rewrites a fraction of the rows of the projection and
LM-head tensors in place, ``graph`` changes only what the runtime compiles, ``whole``
draws every weight again. Both formats keep BF16 weights in one ``model.safetensors``, so
a ``rows`` revision is the same operation for both: :func:`rows_revision`.

The tensors a ``rows`` revision touches are the ones an owner may replace in place
(:func:`is_admissible`: attention and MLP projections and the LM head, under the names of
the cpu format, Hugging Face Llama/Qwen2 and GPT-2); the owner's admission uses the same
rule. Every revision starts as a copy of its base (:func:`copy_base`) and ends with its
manifest (:func:`seal`), or is removed.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import numpy as np

from .manifest import DEFAULT_CHUNK_SIZE, MANIFEST_NAME, Manifest
from .scan import build_manifest, write_manifest

WEIGHTS_NAME = "model.safetensors"
REVISION_KINDS = ("rows", "graph", "whole")
ADMISSIBLE_SUFFIXES = (
    "attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight", "attn.o_proj.weight",
    "mlp.up_proj.weight", "mlp.down_proj.weight", "lm_head.weight",
    "mlp.gate_proj.weight",  # Hugging Face Llama / Qwen2 (their attention is self_attn.*)
    "attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight",  # GPT-2
)


class DemoError(ValueError):
    """A demo model cannot be generated or revised as asked."""


def is_admissible(name: str) -> bool:
    """True for tensors whose rows may be replaced in place (projections and LM head)."""
    return name.endswith(ADMISSIBLE_SUFFIXES)


# -- BF16 in safetensors ------------------------------------------------------------
def to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bit patterns (uint16), round to nearest even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def tensor_init(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """(mean, std) a generator draws a tensor's values from: norms near 1, the rest
    scaled by fan-in."""
    if name.endswith("norm.weight"):
        return 1.0, 0.02
    fan_in = shape[-1]
    return 0.0, 1.0 / math.sqrt(fan_in)


def read_layout(path: Path) -> tuple[int, dict]:
    """(data start offset, header dict) of a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return 8 + n, header


# -- revisions ----------------------------------------------------------------------
def copy_base(base: Path, out: Path) -> None:
    """Copy the files of the generated model ``base`` (not its manifest) into the new,
    empty revision directory ``out``."""
    if not (base / WEIGHTS_NAME).is_file() or not (base / "config.json").is_file():
        raise DemoError(f"{base} is not a demo bundle (no config.json or {WEIGHTS_NAME})")
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise DemoError(f"{out} is not empty; refusing to overwrite an existing bundle")
    for p in sorted(base.iterdir()):
        if p.is_file() and p.name != MANIFEST_NAME:
            shutil.copyfile(p, out / p.name)


def seal(out: Path, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Manifest:
    """Write ``out``'s manifest: the directory becomes a bundle."""
    manifest = build_manifest(out, chunk_size=chunk_size)
    write_manifest(out, manifest)
    return manifest


def changed_rows(rows: int, fraction: float, rng: np.random.Generator) -> tuple[int, int]:
    """A contiguous run of ceil(fraction * rows) rows at a seeded offset: (start, count)."""
    count = max(1, min(rows, math.ceil(fraction * rows)))
    start = int(rng.integers(0, rows - count + 1))
    return start, count


def rewrite_rows(path: Path, fraction: float, seed: int, tensors: list[str] | None) -> None:
    """In each named tensor of the safetensors file ``path`` (default: every admissible
    one), give a seeded contiguous run of ``fraction`` of its rows new values, in place."""
    data_start, header = read_layout(path)
    names = tensors if tensors is not None else [n for n in header if is_admissible(n)]
    for name in names:
        if name not in header:
            raise DemoError(f"tensor {name!r} is not in {path.name}")
        if not is_admissible(name):
            raise DemoError(f"tensor {name!r} is not a projection or LM-head tensor")
    with open(path, "r+b") as f:
        for name in names:
            info = header[name]
            rows, width = info["shape"]
            rng = np.random.default_rng([seed, sorted(header).index(name)])
            start, count = changed_rows(rows, fraction, rng)
            mean, std = tensor_init(name, (rows, width))
            new = rng.standard_normal((count, width), dtype=np.float32) * np.float32(std) + np.float32(mean)
            f.seek(data_start + info["data_offsets"][0] + 2 * start * width)
            f.write(to_bf16(new).tobytes())


def check_revision_args(kind: str, fraction: float) -> None:
    if kind not in REVISION_KINDS:
        raise DemoError(f"kind {kind!r} is not one of {', '.join(REVISION_KINDS)}")
    if not 0 < fraction <= 1:
        raise DemoError(f"fraction {fraction} must be in (0, 1]")


def rows_revision(base_dir: Path | str, out_dir: Path | str, fraction: float = 0.005, seed: int = 1,
                  tensors: list[str] | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Manifest:
    """A ``rows`` revision of the generated model ``base_dir`` in ``out_dir``, either format."""
    check_revision_args("rows", fraction)
    base, out = Path(base_dir), Path(out_dir)
    copy_base(base, out)
    try:
        rewrite_rows(out / WEIGHTS_NAME, fraction, seed, tensors)
        return seal(out, chunk_size)
    except Exception:
        shutil.rmtree(out, ignore_errors=True)
        raise
