"""``resident bundle``: build, inspect, verify, diff, push and store model bundles.

Every subcommand works on bundle directories (a directory plus its
``resident-manifest.json``) or, where only the manifest matters, on a manifest file.
Long work (hashing, pushing, materializing, generating demo weights) shows a progress
bar on stderr; ``--quiet`` hides it. Errors are one line on stderr and a non-zero exit
status: 1 when the work failed (bad bytes, unreachable source, full disk), 2 when the
request itself is wrong (bad arguments, bad manifest, impossible plan).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .chunking import CHUNKINGS
from .errors import BundleError, IntegrityMismatch, PlanError, SourceUnavailable, StoreFull
from .manifest import DEFAULT_CHUNK_SIZE, MANIFEST_NAME, Manifest, ManifestError
from .scan import build_manifest, parse_rules, read_manifest, write_manifest

PROG = "resident bundle"
UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
         "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}


class UsageError(Exception):
    """The request is wrong (exit status 2)."""


def parse_size(text: str) -> int:
    """``64MiB``, ``2G``, ``4096`` → bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 4096, 64MiB, 2G)")
    return int(float(m.group(1)) * UNITS[m.group(2) or ""])


@contextmanager
def progress_bar(args: argparse.Namespace, total: int | None, desc: str) -> Iterator:
    """A tqdm byte counter (or a no-op with --quiet); yields the ``progress(n)`` callback."""
    if args.quiet:
        yield None
        return
    from tqdm import tqdm
    with tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
              file=sys.stderr, leave=False, dynamic_ncols=True) as bar:
        yield bar.update


def load_manifest(where: str) -> Manifest:
    """A manifest from a bundle directory or a manifest file."""
    p = Path(where)
    if p.is_dir():
        return read_manifest(p)
    try:
        return Manifest.parse(p.read_bytes())
    except FileNotFoundError:
        raise UsageError(f"{where}: no such bundle directory or manifest file") from None


def _dir_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file() and not f.is_symlink())


# -- subcommands ----------------------------------------------------------------------
def cmd_build(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    if not root.is_dir():
        raise UsageError(f"{root}: not a directory")
    rules = parse_rules(args.role)
    with progress_bar(args, _dir_bytes(root), f"hashing {root.name}") as cb:
        m = build_manifest(root, rules=rules, chunk_size=args.chunk_size, progress=cb,
                           chunking=args.chunking)
    path = write_manifest(root, m)
    print(json.dumps({"manifest": str(path), **m.identity(), "files": len(m.files),
                      "bytes": m.total_bytes}, indent=2) if args.json else
          f"{m.digest}\n  wrote {path} ({len(m.files)} files, {m.total_bytes} bytes)")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    m = load_manifest(args.bundle)
    if args.json:
        print(json.dumps({"identity": m.identity(), "chunkSize": m.chunk_size,
                          "bytes": m.total_bytes,
                          "files": [{"path": f.path, "role": f.role.value, "size": f.size,
                                     "sha256": f.sha256, "chunks": len(f.chunks)}
                                    for f in m.files]}, indent=2))
        return 0
    ident = m.identity()
    print(f"bundle   {ident['bundle']}\ngraph    {ident['graph']}\nweights  {ident['weights']}")
    print(f"chunk    {m.chunk_size} bytes; {len(m.files)} files, {m.total_bytes} bytes")
    for f in m.files:
        print(f"  {f.role.value:<10}{f.size:>14}  {f.path}" + (f"  ({len(f.chunks)} chunks)"
                                                             if f.chunks else ""))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    m = read_manifest(root)
    with progress_bar(args, m.total_bytes, f"verifying {root.name}") as cb:
        try:
            actual = build_manifest(root, rules=[(f.path, f.role) for f in m.files],
                                    chunk_size=m.chunk_size, progress=cb,
                                    chunking="tensors" if any(f.offsets for f in m.files) else "fixed")
        except ManifestError as e:
            print(f"{PROG}: {root}: {e}", file=sys.stderr)
            return 1
    want, have = m.by_path(), actual.by_path()
    problems = [f"missing: {p}" for p in sorted(want.keys() - have.keys())]
    problems += [f"not in the manifest: {p}" for p in sorted(have.keys() - want.keys())]
    for p in sorted(want.keys() & have.keys()):
        w, h = want[p], have[p]
        if w.size != h.size:
            problems.append(f"size differs: {p} ({h.size} bytes, manifest says {w.size})")
        elif w.sha256 != h.sha256 or w.chunks != h.chunks:
            bad = [i for i, (a, b) in enumerate(zip(w.chunks, h.chunks)) if a != b]
            problems.append(f"content differs: {p}" + (f" (chunks {bad[:10]})" if bad else ""))
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        print(f"{PROG}: {root}: {len(problems)} problem(s); the bundle does not match "
              f"{m.digest}", file=sys.stderr)
        return 1
    print(f"ok {m.digest} ({len(m.files)} files, {m.total_bytes} bytes verified)")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from .plan import plan_delivery
    donor, target = load_manifest(args.a), load_manifest(args.b)
    plan = plan_delivery(target, donor, mode=args.mode, rebase=args.rebase,
                         min_reuse=args.min_reuse, reflink=not args.no_reflink)
    if args.json:
        print(json.dumps({**plan.to_status(), "target": plan.target_digest,
                          "donor": plan.donor_digest, "identicalFiles": plan.identical_files,
                          "changedChunks": plan.changed_chunks,
                          "clonedChunks": plan.cloned_chunks}, indent=2))
    else:
        print(plan.describe())
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    from . import sources
    m = read_manifest(args.dir)
    with progress_bar(args, m.total_bytes, f"pushing to {args.target}") as cb:
        digest = sources.push(Path(args.dir), args.target, progress=cb,
                              credentials=source_credentials(args.target))
    print(f"{digest}\n  pushed to {args.target}")
    return 0


@contextmanager
def watch_file(args: argparse.Namespace, path: Path, total: int, desc: str) -> Iterator[None]:
    """A progress bar that follows the size of a file another function is writing."""
    import threading
    stop = threading.Event()
    with progress_bar(args, total, desc) as cb:
        def poll() -> None:
            seen = 0
            while not stop.wait(0.2):
                size = path.stat().st_size if path.exists() else 0
                if cb and size > seen:
                    cb(size - seen)
                    seen = size
        t = threading.Thread(target=poll, daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join()


def cmd_make_demo(args: argparse.Namespace) -> int:
    from . import cpu_model, hf_demo
    from .model_revisions import WEIGHTS_NAME
    out = Path(args.out)
    weights = out / WEIGHTS_NAME
    if args.base:
        if args.size is not None:
            raise UsageError("--size applies to a new demo, not to a revision (--from)")
        base_size = (Path(args.base) / WEIGHTS_NAME)
        total = base_size.stat().st_size if base_size.is_file() else None
        hf = hf_demo.is_hf_checkpoint(args.base)  # the revision keeps the base's format
        with watch_file(args, weights, total, f"deriving a {args.kind} revision"):
            m = (hf_demo.make_hf_revision if hf else cpu_model.make_revision)(
                args.base, out, args.kind, args.fraction, args.seed, chunk_size=args.chunk_size)
    else:
        if args.size is None:
            raise UsageError("give --size for a new demo bundle, or --from BASE for a revision")
        make = hf_demo.make_hf_demo if args.format == "hf" else cpu_model.make_demo
        with watch_file(args, weights, args.size, "generating demo weights"):
            m = make(out, args.size, args.seed, chunk_size=args.chunk_size)
    print(f"{m.digest}\n  wrote {out} ({m.total_bytes} bytes)")
    return 0


def cmd_serve_demo(args: argparse.Namespace) -> int:
    from .demo_server import serve_demo
    return serve_demo(args)


def source_credentials(uri: str):
    """The credentials of the person running the CLI, for the scheme of ``uri``."""
    from urllib.parse import urlsplit
    from .sources.credentials import SCHEME_KEYS, from_environment
    keys = SCHEME_KEYS.get(urlsplit(uri).scheme)
    return from_environment(keys) if keys else None


def cmd_digest(args: argparse.Namespace) -> int:
    from .sources.hf import HfSource
    if not args.source.startswith("hf://"):
        raise UsageError(f"{args.source!r}: only hf:// sources are made into a bundle here; a "
                         "directory's digest is what 'resident bundle build' prints, and the other "
                         "sources hold bundles by digest already")
    with HfSource(args.source, credentials=source_credentials(args.source)) as src:
        total = src.bundle_bytes()
        with progress_bar(args, total, f"hashing {src.loc.repo_id}@{src.commit()[:12]}") as cb:
            m = src.manifest(progress=cb)
    if args.manifest:
        Path(args.manifest).write_bytes(m.canonical_json())
    if args.json:
        print(json.dumps({"source": args.source, **m.identity(), "bytes": m.total_bytes,
                          "files": len(m.files)}, indent=2))
    else:
        print(m.digest)
    return 0


def cmd_materialize(args: argparse.Namespace) -> int:
    from .sources import open_source
    from .store import Store
    store = Store(args.store)
    source = open_source(args.source, credentials=source_credentials(args.source))
    manifest = source.fetch_manifest(args.digest)
    with progress_bar(args, manifest.total_bytes, f"materializing {args.digest[:19]}") as cb:
        res = store.materialize(manifest, source, donor=args.donor, mode=args.mode,
                                rebase=args.rebase, min_reuse=args.min_reuse, progress=cb)
    print(json.dumps({**res.to_status(), "path": str(res.path)}, indent=2))
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from .store import Store
    store = Store(args.store)
    before = store.usage_bytes()
    removed = store.gc(args.high, args.low)
    print(json.dumps({"removed": removed, "bytesBefore": before,
                      "bytesAfter": store.usage_bytes()}, indent=2))
    return 0


# -- argument parsing -----------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.replace("``", "'"),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.add_argument("--log-level", default="WARNING", help="JSON log level on stderr")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, fn, help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.set_defaults(fn=fn)
        return sp

    def plan_options(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--mode", default="Auto", choices=["Auto", "GraphOnly", "WholeBundle"],
                        help="delivery path (default Auto: graph-only when the weights match)")
        sp.add_argument("--rebase", default="Auto", choices=["Auto", "Never"],
                        help="build on the donor (Auto) or write every byte (Never)")
        sp.add_argument("--min-reuse", type=float, default=0.5,
                        help="refuse a rebase reusing less than this fraction (default 0.5)")

    sp = add("build", cmd_build, "hash a directory and write its resident-manifest.json")
    sp.add_argument("dir", help="the bundle directory")
    sp.add_argument("--role", action="append", default=[], metavar="PATTERN=ROLE",
                    help="role rule before the defaults (graph|weights|config|tokenizer)")
    sp.add_argument("--chunk-size", type=parse_size, default=DEFAULT_CHUNK_SIZE,
                    help="chunk size for large files (default 4MiB, a multiple of 4096)")
    sp.add_argument("--chunking", choices=CHUNKINGS, default="fixed",
                    help="fixed: chunks are slices of the chunk size (default); tensors: a "
                         "safetensors file is cut at its tensors, so that a changed tensor moves "
                         "alone (another digest for the same files; docs/bundle.md)")
    sp.add_argument("--json", action="store_true", help="print the identity as JSON")

    sp = add("inspect", cmd_inspect, "show a bundle's identity and files")
    sp.add_argument("bundle", help=f"a bundle directory or a {MANIFEST_NAME} file")
    sp.add_argument("--json", action="store_true")

    sp = add("verify", cmd_verify, "re-hash a bundle directory against its manifest")
    sp.add_argument("dir")

    sp = add("diff", cmd_diff, "plan the delivery from bundle A (on the node) to bundle B")
    sp.add_argument("a", help="the donor: bundle directory or manifest file")
    sp.add_argument("b", help="the target: bundle directory or manifest file")
    plan_options(sp)
    sp.add_argument("--no-reflink", action="store_true",
                    help="predict writes for a filesystem without reflink (clones are copied)")
    sp.add_argument("--json", action="store_true", help="print the plan as status JSON")

    sp = add("push", cmd_push, "publish a built bundle to file:///dir, http(s)://…, oci://… or "
             "s3://bucket/prefix (signed with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
             "[/AWS_SESSION_TOKEN] from the environment, else anonymous)")
    sp.add_argument("dir")
    sp.add_argument("target")

    sp = add("digest", cmd_digest,
             "print the bundle digest of a Hugging Face repository at a commit, "
             "hf://org/name@<commit>[?endpoint=http(s)://host:port][&chunk=BYTES]: the value of "
             "spec.bundle.digest for that source. It lists the repository's files at the commit and "
             "reads each once to hash it (a progress bar shows the bytes), checking each against "
             "the Hub's LFS oid or git blob id. A branch name is refused with the commit it points "
             "at now. A private repository is read with HF_TOKEN from the environment (on a node, "
             "the model's Secret); the server is the URI's endpoint, never HF_ENDPOINT")
    sp.add_argument("source", help="hf://org/name@<40-hex commit>[?endpoint=…][&chunk=…]")
    sp.add_argument("--manifest", metavar="FILE", help="also write the bundle's manifest to FILE")
    sp.add_argument("--json", action="store_true",
                    help="print the identity (bundle, graph and weights digests), bytes and files as JSON")

    sp = add("make-demo", cmd_make_demo,
             "generate a demo model bundle (--size) or derive a revision of one (--from)")
    sp.add_argument("out", help="output directory (must be absent or empty)")
    sp.add_argument("--size", type=parse_size, help="weights size of a new demo, e.g. 64MiB")
    sp.add_argument("--format", default="numpy", choices=["numpy", "hf"],
                    help="numpy: the cpu backend's own model (default); hf: a Hugging Face "
                         "Llama-style checkpoint for the torch backend (needs the torch extra). "
                         "A revision (--from) keeps its base's format")
    sp.add_argument("--from", dest="base", help="base demo bundle to derive a revision from")
    sp.add_argument("--kind", default="rows", choices=["rows", "graph", "whole"],
                    help="revision kind: rows (some rows change), graph, whole (new weights)")
    sp.add_argument("--fraction", type=float, default=0.005, help="fraction of rows changed")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--chunk-size", type=parse_size, default=DEFAULT_CHUNK_SIZE)

    sp = add("serve-demo", cmd_serve_demo, "generate the demo model, serve it over HTTP and print "
             "the ResidentModel to apply (the README's first model)")
    from .demo_server import add_arguments
    add_arguments(sp, parse_size)

    sp = add("materialize", cmd_materialize,
             "fetch a bundle into a node content store (what the bridge does on publish)")
    sp.add_argument("--store", required=True, help="store directory")
    sp.add_argument("source", help="source URI (file://, http(s)://, oci://, s3://, hf://)")
    sp.add_argument("digest", help="bundle digest sha256:…")
    sp.add_argument("--donor", help="a revision in the store to rebase on")
    plan_options(sp)

    sp = add("gc", cmd_gc, "remove unleased content, LRU first, above a high watermark")
    sp.add_argument("--store", required=True)
    sp.add_argument("--high", type=parse_size, required=True, help="act above this usage")
    sp.add_argument("--low", type=parse_size, required=True, help="remove down to this usage")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    from .jsonlog import configure
    configure(args.log_level.upper())
    try:
        return args.fn(args)
    except (UsageError, ManifestError, PlanError) as e:
        print(f"{PROG} {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (IntegrityMismatch, SourceUnavailable, StoreFull, BundleError, OSError) as e:
        print(f"{PROG} {args.command}: failed: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # e.g. the demo generator refusing its arguments
        print(f"{PROG} {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
