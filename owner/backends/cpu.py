"""The cpu backend: a real decoder-only transformer in numpy over BF16 safetensors.

Loading compiles the graph (see :mod:`owner.graph`) and reads every weights file with
its chunks' sha256 checked, widening BF16 to float32 once into the graph's weight buffers
(a tensor whose name, dtype or shape the config does not imply is refused). Rows of live
tensors are exposed to :mod:`owner.inplace` as BF16 bit patterns, which float32 values
widened from BF16 give back exactly, so in-place verification compares the exact bytes
the bundle holds. Reload closes the old revision before reading the new one and keeps
the compiled graph, weight buffers included, when the target's graph digest is unchanged.
A reload whose target holds the live weights (the same weights digest) keeps them where
they are instead: only the target's graph is compiled, bound to the filled weight
buffers, and no weights file is read (see :meth:`CpuBackend._rebind`). Prompts and
answers go through the revision's ``tokenizer.json`` (:class:`bundle.cpu_model.Tokenizer`).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import numpy as np

from bundle.cpu_model import Tokenizer
from bundle.manifest import Role

from .. import admission
from ..decoder import Decoder, bf16_to_f32
from ..graph import CompiledGraph, GraphError, LayoutChanged, compile_graph
from ..inplace import ApplyReport, StagedUpdate
from ..revisions import Revision, map_verified, read_verified
from ..safetensors_layout import Layout, LayoutError, parse_layout
from .base import (
    BackendError, Description, LoadReport, Output, Piece, ReloadRefused, Residency, apply_and_advance,
)


class CpuBackend:
    name = "cpu"

    def __init__(self, verify_chunks: bool = False) -> None:
        self.verify_chunks = verify_chunks
        self.revision: Revision | None = None
        self.graph: CompiledGraph | None = None
        self.weights: dict[str, np.ndarray] = {}
        self.decoder: Decoder | None = None
        self.tokenizer = Tokenizer()
        self._layouts: dict[str, Layout] = {}

    # -- lifecycle ---------------------------------------------------------------
    def load(self, revision: Revision) -> LoadReport:
        if self.revision is not None:
            raise BackendError("a revision is already loaded; use reload")
        return self._load(revision, keep=None)

    def reload(self, revision: Revision) -> LoadReport:
        """Keep the live weights if the target's are the same files (:meth:`_rebind`); else
        close the old runtime first and load the target, keeping the compiled graph (and
        its weight arena) when the graph digest matches."""
        if self.revision is not None and \
                self.revision.manifest.weights_digest == revision.manifest.weights_digest:
            return self._rebind(revision)
        keep = self.graph if self.graph and self.graph.digest == revision.manifest.graph_digest else None
        self.close()
        return self._load(revision, keep)

    def _rebind(self, rev: Revision) -> LoadReport:
        """Move to ``rev``, whose weights files are the live revision's (equal weights
        digests: the same paths and sha256, so the same bytes, verified when the arena was
        filled or rows were written in place): the live arena stays, no weights file is
        read, and only a changed graph is compiled, bound to that arena (and to the old
        graph's KV arenas where a variant keeps its shape). The new graph is compiled while
        the old one is still loaded, and nothing of the old one is written, so a failure
        raises ReloadRefused with the old revision loaded and whole. A config that implies
        another tensor layout is refused the same way: the same weights files cannot fill
        it (a cold start on that revision fails too), so closing the live revision for it
        would only leave the owner unloaded."""
        t0 = time.perf_counter()
        graph = self.graph
        try:
            tokenizer = _tokenizer(rev)
        except BackendError as e:
            raise ReloadRefused(str(e)) from e
        if graph.digest != rev.manifest.graph_digest:
            try:
                graph = self._compile(rev, bind=self.graph)
            except LayoutChanged as e:
                raise ReloadRefused(f"{e}; its weights files are the live revision's, which "
                                    "cannot hold that layout") from e
            except Exception as e:  # noqa: BLE001 - nothing live changed: whatever failed, the old revision serves
                raise ReloadRefused(f"{type(e).__name__}: {e}") from e
        reused = graph is self.graph
        self.graph, self.decoder, self.revision = graph, Decoder(self.weights, graph), rev
        self.tokenizer = tokenizer
        return LoadReport(0.0, time.perf_counter() - t0, reused, weights_reused=True)

    def close(self) -> None:
        self.revision, self.decoder, self.graph = None, None, None
        self.weights, self._layouts = {}, {}

    # -- a reload in two steps: load beside the live revision, then swap -------------
    def load_beside(self, revision: Revision) -> "CpuBackend":
        """Load ``revision`` into a backend of its own while this one serves (a lockstep
        switch's prepare): memory for both for a while, and the swap that follows is all
        the live revision's downtime. Raises ReloadRefused: nothing live is touched."""
        beside = CpuBackend(self.verify_chunks)
        try:
            beside.load(revision)
        except Exception as e:  # noqa: BLE001 - the live revision still serves, whole
            raise ReloadRefused(f"loading {revision.digest} beside the live revision failed: "
                                f"{type(e).__name__}: {e}") from e
        return beside

    def swap_in(self, beside: "CpuBackend") -> LoadReport:
        """Take over what :meth:`load_beside` loaded; the old revision's memory goes."""
        t0 = time.perf_counter()
        self.revision, self.graph, self.weights = beside.revision, beside.graph, beside.weights
        self.decoder, self.tokenizer, self._layouts = beside.decoder, beside.tokenizer, beside._layouts
        beside.close()
        return LoadReport(0.0, time.perf_counter() - t0, graph_reused=False)

    def _load(self, rev: Revision, keep: CompiledGraph | None) -> LoadReport:
        m = rev.manifest
        t0 = time.perf_counter()
        try:
            graph = keep or self._compile(rev)
            tokenizer = _tokenizer(rev)
            t1 = time.perf_counter()
            loaded, layouts = set(), {}
            for entry in m.files_with(Role.weights):
                mm = map_verified(rev, entry)
                try:
                    layout = parse_layout(mm, entry.size)
                    jobs = []
                    for slot in layout.tensors:
                        jobs.append((slot, _buffer_for(graph, slot, loaded)))
                        loaded.add(slot.name)
                    _widen_all(mm, jobs)
                finally:
                    mm.close()
                layouts[entry.path] = layout
            missing = sorted(set(graph.weights) - loaded)
            if missing:
                raise BackendError(f"weights miss tensor {missing[0]}" + (f" and {len(missing) - 1} more"
                                                                           if len(missing) > 1 else ""))
        except (GraphError, LayoutError) as e:
            raise BackendError(str(e)) from None
        self.graph, self.weights, self._layouts = graph, graph.weights, layouts
        self.decoder = Decoder(graph.weights, graph)
        self.revision, self.tokenizer = rev, tokenizer
        return LoadReport(time.perf_counter() - t1, t1 - t0, keep is not None)

    def _compile(self, rev: Revision, bind: CompiledGraph | None = None) -> CompiledGraph:
        m = rev.manifest
        graphs = m.files_with(Role.graph)
        configs = [f for f in m.files_with(Role.config) if f.path.endswith("config.json")]
        if len(graphs) != 1 or len(configs) != 1:
            raise BackendError("the cpu backend needs exactly one graph file and one config.json")
        return compile_graph(bytes(read_verified(rev, graphs[0])), bytes(read_verified(rev, configs[0])),
                             m.graph_digest, bind)

    # -- serving -----------------------------------------------------------------
    def describe(self) -> Description:
        ident = self.revision.manifest.identity() if self.revision else None
        where = Residency("cpu", "float32", sum(w.nbytes for w in self.weights.values())) if self.revision else None
        return Description(self.name, True, ident, tuple(self.variants()), where)

    def variants(self) -> list[str]:
        return [v.name for v in self.graph.variants] if self.graph else []

    def generate(self, prompt: str, max_tokens: int, variant: str | None = None) -> Output:
        return self._generate(self.tokenizer.encode(prompt), max_tokens, variant)

    def first_token(self, variant: str | None = None) -> Output:
        """One token after token 0, whatever the tokenizer makes of text (the cpu format
        has no BOS; a words tokenizer encodes a newline to no token)."""
        return self._generate([0], 1, variant)

    def _generate(self, tokens: list[int], max_tokens: int, variant: str | None) -> Output:
        if self.decoder is None:
            raise BackendError("no model is loaded")
        chosen = None
        if variant is not None:
            chosen = next((v for v in self.graph.variants if v.name == variant), None)
            if chosen is None:
                raise BackendError(f"no compiled variant named {variant!r}")
        try:
            gen = self.decoder.generate(tokens, max_tokens, chosen)
        except (ValueError, GraphError) as e:
            raise BackendError(str(e)) from None
        return Output(gen.tokens, self.tokenizer.decode(gen.tokens), gen.first_token_seconds, gen.logits,
                      len(tokens))

    def generate_stream(self, prompt: str, max_tokens: int) -> Iterator[Piece]:
        """One piece per generated token (:meth:`Tokenizer.pieces`), so the pieces' texts
        join to ``generate``'s text."""
        if self.decoder is None:
            raise BackendError("no model is loaded")
        tokens = self.tokenizer.encode(prompt)
        steps = (token for token, _ in self.decoder.steps(tokens, max_tokens))
        try:
            for token, text in self.tokenizer.pieces(steps):
                yield Piece([] if token is None else [token], text, len(tokens))
        except (ValueError, GraphError) as e:
            raise BackendError(str(e)) from None

    # -- in place ----------------------------------------------------------------
    def stage_in_place(self, revision: Revision) -> StagedUpdate:
        if self.revision is None:
            raise BackendError("no model is loaded")
        return admission.stage(self, self.revision.manifest, revision)

    def apply_in_place(self, update: StagedUpdate) -> ApplyReport:
        return apply_and_advance(self, self, update, self.verify_chunks)

    # RowStore, used by owner.inplace
    def layouts(self) -> dict[str, Layout]:
        return self._layouts

    def tensor_bytes(self, name: str, start: int, end: int) -> bytes:
        return self.live_bits(name).reshape(-1)[start // 2:end // 2].tobytes()

    def live_bits(self, name: str) -> np.ndarray:
        """A view, not a copy: the high half-word of each float32 widened from BF16."""
        return self.weights[name].view(np.uint16)[..., 1::2]

    def read_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        return self.live_bits(name)[rows]

    def write_rows(self, name: str, rows: np.ndarray, values: np.ndarray) -> None:
        self.weights[name][rows] = bf16_to_f32(values)

    def release_staged(self, update: StagedUpdate) -> None:
        update.patches = []


def _widen_all(mm, jobs: list[tuple]) -> None:
    """Widen every (slot, buffer) from the verified map, tensors spread over all cores
    (numpy releases the GIL while it widens). No array views the map when this returns."""
    def widen(job) -> None:
        slot, out = job
        bf16_to_f32(np.frombuffer(mm, np.uint16, (slot.end - slot.start) // 2, slot.start), out=out)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(widen, jobs))


def _buffer_for(graph: CompiledGraph, slot, loaded: set[str]) -> np.ndarray:
    """The graph's buffer for a tensor of the file, if its name, dtype and shape fit it."""
    if slot.dtype != "BF16":
        raise BackendError(f"tensor {slot.name}: dtype {slot.dtype}, the cpu backend reads BF16")
    if slot.start % 2:
        raise BackendError(f"tensor {slot.name} starts at odd byte {slot.start}: the cpu backend needs "
                           "BF16 values 2-byte aligned (pad the safetensors header to 8 bytes)")
    buffer = graph.weights.get(slot.name)
    if buffer is None:
        raise BackendError(f"tensor {slot.name} is not one the config implies")
    if slot.name in loaded:
        raise BackendError(f"tensor {slot.name} appears twice in the weights files")
    if tuple(slot.shape) != buffer.shape:
        raise BackendError(f"tensor {slot.name} has shape {tuple(slot.shape)}, config implies {buffer.shape}")
    return buffer


def _tokenizer(rev: Revision) -> Tokenizer:
    """The revision's ``tokenizer.json`` (the byte tokenizer if it has none)."""
    files = [f for f in rev.manifest.files_with(Role.tokenizer) if f.path.endswith("tokenizer.json")]
    if len(files) > 1:
        raise BackendError("the cpu backend needs at most one tokenizer.json")
    try:
        return Tokenizer.from_json(bytes(read_verified(rev, files[0])) if files else None)
    except ValueError as e:
        raise BackendError(str(e)) from None
