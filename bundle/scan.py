"""Turn a directory into a manifest: walk it, hash it, assign roles.

Roles come from ordered glob rules over the relative path; the first match wins. The
defaults cover common layouts; a user overrides them with ``--role PATTERN=ROLE`` or
a ``.resident-roles`` file in the directory (one ``PATTERN ROLE`` per line), both
consulted before the defaults. Symlinks, device files, sockets and FIFOs are refused:
a bundle is regular files only.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from pathlib import Path
from typing import Callable, Iterable

from .chunking import FileHasher
from .manifest import (
    DEFAULT_CHUNK_SIZE, MANIFEST_NAME, FileEntry, Manifest, ManifestError, Role, build_entries,
    check_relative_path,
)

ROLES_FILE = ".resident-roles"
DEFAULT_RULES: tuple[tuple[str, Role], ...] = (
    ("*.safetensors", Role.weights), ("*.bin", Role.weights), ("*.pt", Role.weights),
    ("*.npy", Role.weights),
    ("tokenizer*", Role.tokenizer), ("*/tokenizer*", Role.tokenizer), ("*.model", Role.tokenizer),
    ("vocab*", Role.tokenizer), ("merges.txt", Role.tokenizer),
    ("*graph*", Role.graph), ("*.onnx", Role.graph), ("*.enf", Role.graph), ("*.rbln", Role.graph),
    ("*.plan", Role.graph),
)
Progress = Callable[[int], None]  # called with the number of bytes just processed


def parse_rules(lines: Iterable[str]) -> list[tuple[str, Role]]:
    rules = []
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        pattern, _, role = line.replace("=", " ").rpartition(" ")
        try:
            rules.append((pattern.strip(), Role(role.strip())))
        except ValueError:
            raise ManifestError(f"role rule {n} {line!r}: role must be one of "
                                f"{', '.join(r.value for r in Role)}") from None
    return rules


def role_for(path: str, rules: Iterable[tuple[str, Role]]) -> Role:
    for pattern, role in rules:
        if fnmatch.fnmatchcase(path, pattern):
            return role
    return Role.config


def hash_file(path: Path, size: int, chunk_size: int, progress: Progress | None = None,
              chunking: str = "fixed") -> tuple[str, tuple[str, ...], tuple[int, ...]]:
    """Whole-file sha256, per-chunk sha256s and chunk offsets (:mod:`bundle.chunking`), in one read."""
    hasher = FileHasher(path.name, size, chunk_size, chunking)
    with open(path, "rb") as f:
        while block := f.read(chunk_size):
            hasher.update(block)
            if progress:
                progress(len(block))
    return hasher.result()


def walk_files(root: Path) -> list[tuple[str, int]]:
    """(relative path, size) of every regular file under ``root``; refuse anything else."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            st = os.lstat(full)
            rel = full.relative_to(root).as_posix()
            if stat.S_ISLNK(st.st_mode):
                raise ManifestError(f"{rel}: symlinks are not allowed in a bundle")
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise ManifestError(f"{rel}: only regular files are allowed (device, socket or fifo)")
            if rel in (MANIFEST_NAME, ROLES_FILE):
                continue
            found.append((check_relative_path(rel), st.st_size))
    return sorted(found)


def build_manifest(root: Path | str, rules: Iterable[tuple[str, Role]] = (),
                   chunk_size: int = DEFAULT_CHUNK_SIZE, progress: Progress | None = None,
                   chunking: str = "fixed") -> Manifest:
    """Hash every file under ``root`` and return its manifest (nothing is written);
    ``chunking``: how files are cut into chunks (:mod:`bundle.chunking`)."""
    root = Path(root)
    all_rules = list(rules)
    if (root / ROLES_FILE).is_file():
        all_rules += parse_rules((root / ROLES_FILE).read_text().splitlines())
    all_rules += DEFAULT_RULES
    entries = []
    for rel, size in walk_files(root):
        sha, chunks, offsets = hash_file(root / rel, size, chunk_size, progress, chunking)
        entries.append(FileEntry(path=rel, size=size, sha256=sha, role=role_for(rel, all_rules),
                                 chunks=chunks, offsets=offsets))
    return build_entries(entries, chunk_size)


def write_manifest(root: Path | str, manifest: Manifest) -> Path:
    """Write the canonical manifest next to the files (temporary name, then rename)."""
    root = Path(root)
    tmp = root / f".{MANIFEST_NAME}.tmp"
    tmp.write_bytes(manifest.canonical_json())
    os.replace(tmp, root / MANIFEST_NAME)
    return root / MANIFEST_NAME


def read_manifest(root: Path | str) -> Manifest:
    path = Path(root) / MANIFEST_NAME
    try:
        return Manifest.parse(path.read_bytes())
    except FileNotFoundError:
        raise ManifestError(f"{path}: no manifest (run 'resident bundle build {root}')") from None
