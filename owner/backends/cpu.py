"""The cpu backend: a real decoder-only transformer in numpy over BF16 safetensors.

Loading compiles the graph (see :mod:`owner.graph`) and reads every weights file with
its sha256 checked, widening BF16 to float32 once. Rows of live tensors are exposed to
:mod:`owner.inplace` as BF16 bit patterns, which float32 values widened from BF16 give
back exactly, so in-place verification compares the exact bytes the bundle holds.
Reload closes the old weights before reading the new ones and keeps the compiled graph
when the target's graph digest is unchanged.
"""

from __future__ import annotations

import time

import numpy as np

from bundle.demo import tensor_shapes
from bundle.manifest import Role

from .. import admission, inplace
from ..decoder import Decoder, bf16_to_f32, f32_to_bf16_bits
from ..graph import CompiledGraph, GraphError, compile_graph
from ..inplace import ApplyReport, ReleaseFailed, StagedUpdate
from ..revisions import Revision, map_verified, read_verified
from ..safetensors_layout import Layout, LayoutError, parse_layout
from .base import BackendError, Description, LoadReport, Output


class CpuBackend:
    name = "cpu"

    def __init__(self, verify_chunks: bool = False) -> None:
        self.verify_chunks = verify_chunks
        self.revision: Revision | None = None
        self.graph: CompiledGraph | None = None
        self.weights: dict[str, np.ndarray] = {}
        self.decoder: Decoder | None = None
        self._layouts: dict[str, Layout] = {}

    # -- lifecycle ---------------------------------------------------------------
    def load(self, revision: Revision) -> LoadReport:
        if self.revision is not None:
            raise BackendError("a revision is already loaded; use reload")
        return self._load(revision, keep=None)

    def reload(self, revision: Revision) -> LoadReport:
        """Close the old runtime first; keep its compiled graph if the graph digest matches."""
        keep = self.graph if self.graph and self.graph.digest == revision.manifest.graph_digest else None
        self.close()
        return self._load(revision, keep)

    def close(self) -> None:
        self.revision, self.decoder, self.graph = None, None, None
        self.weights, self._layouts = {}, {}

    def _load(self, rev: Revision, keep: CompiledGraph | None) -> LoadReport:
        m = rev.manifest
        t0 = time.perf_counter()
        try:
            graph = keep or self._compile(rev)
            t1 = time.perf_counter()
            weights, layouts = {}, {}
            for entry in m.files_with(Role.weights):
                mm, bits = map_verified(rev, entry), None
                try:
                    layout = parse_layout(mm, entry.size)
                    for slot in layout.tensors:
                        if slot.dtype != "BF16":
                            raise BackendError(f"tensor {slot.name}: dtype {slot.dtype}, the cpu backend reads BF16")
                        bits = np.frombuffer(mm, np.uint16, (slot.end - slot.start) // 2, slot.start)
                        weights[slot.name] = bf16_to_f32(bits).reshape(slot.shape)
                        del bits  # the map can only close once no array views it
                finally:
                    bits = None
                    mm.close()
                layouts[entry.path] = layout
            _check_shapes(weights, graph.config)
        except (GraphError, LayoutError) as e:
            raise BackendError(str(e)) from None
        self.graph, self.weights, self._layouts = graph, weights, layouts
        self.decoder = Decoder(weights, graph)
        self.revision = rev
        return LoadReport(time.perf_counter() - t1, t1 - t0, keep is not None)

    def _compile(self, rev: Revision) -> CompiledGraph:
        m = rev.manifest
        graphs = m.files_with(Role.graph)
        configs = [f for f in m.files_with(Role.config) if f.path.endswith("config.json")]
        if len(graphs) != 1 or len(configs) != 1:
            raise BackendError("the cpu backend needs exactly one graph file and one config.json")
        return compile_graph(bytes(read_verified(rev, graphs[0])), bytes(read_verified(rev, configs[0])),
                             m.graph_digest)

    # -- serving -----------------------------------------------------------------
    def describe(self) -> Description:
        ident = self.revision.manifest.identity() if self.revision else None
        return Description(self.name, True, ident, tuple(self.variants()))

    def variants(self) -> list[str]:
        return [v.name for v in self.graph.variants] if self.graph else []

    def generate(self, prompt: str, max_tokens: int, variant: str | None = None) -> Output:
        if self.decoder is None:
            raise BackendError("no model is loaded")
        tokens = list(prompt.encode("utf-8"))
        chosen = None
        if variant is not None:
            chosen = next((v for v in self.graph.variants if v.name == variant), None)
            if chosen is None:
                raise BackendError(f"no compiled variant named {variant!r}")
        try:
            gen = self.decoder.generate(tokens, max_tokens, chosen)
        except (ValueError, GraphError) as e:
            raise BackendError(str(e)) from None
        text = bytes(gen.tokens).decode("utf-8", errors="replace")
        return Output(gen.tokens, text, gen.first_token_seconds, gen.logits)

    # -- in place ----------------------------------------------------------------
    def stage_in_place(self, revision: Revision) -> StagedUpdate:
        if self.revision is None:
            raise BackendError("no model is loaded")
        return admission.stage(self, self.revision.manifest, revision)

    def apply_in_place(self, update: StagedUpdate) -> ApplyReport:
        try:
            report = inplace.apply(self, update, self.verify_chunks)
        except ReleaseFailed as e:
            if e.applied:
                self.revision = update.target
            raise
        self.revision = update.target
        return report

    # RowStore, used by owner.inplace
    def layouts(self) -> dict[str, Layout]:
        return self._layouts

    def tensor_bytes(self, name: str, start: int, end: int) -> bytes:
        flat = self.weights[name].reshape(-1)
        return f32_to_bf16_bits(flat[start // 2:end // 2]).tobytes()

    def read_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        return f32_to_bf16_bits(self.weights[name][rows])

    def write_rows(self, name: str, rows: np.ndarray, values: np.ndarray) -> None:
        self.weights[name][rows] = bf16_to_f32(values)

    def release_staged(self, update: StagedUpdate) -> None:
        update.patches = []


def _check_shapes(weights: dict[str, np.ndarray], config: dict) -> None:
    for name, shape in tensor_shapes(config):
        if name not in weights:
            raise BackendError(f"weights miss tensor {name}")
        if weights[name].shape != shape:
            raise BackendError(f"tensor {name} has shape {weights[name].shape}, config implies {shape}")
