"""The compiled graph: the execution plan a runtime derives from config + graph file.

On an NPU the "graph" is a compiled program; compiling it is the expensive, weight-
independent half of loading a model. The cpu backend mirrors that split honestly: it
parses ``graph.json`` against ``config.json``, checks every op and every layer, and for
each serving *variant* (batch, sequence length) precomputes the rotary tables and the
causal mask and allocates (and touches) the KV-cache arena that generation writes into.
Its memory plan also holds the weights: one float32 buffer with a view per tensor the
config implies, allocated and touched here and filled by each load, as a device runtime
allocates a program's weight buffers once and uploads into them. All of it depends only
on the graph digest (graph + config files), so a reload to a revision with the same graph
digest keeps the compiled graph, its arenas included, and skips this work. A new graph
over the same weights is *bound* to the weight arena an earlier graph filled (as a device
runtime binds a new program to buffers already uploaded), if its config implies exactly
the tensors that arena holds (otherwise it says :class:`LayoutChanged` before allocating
anything), and takes over the earlier graph's KV arenas for variants of the same shape.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from bundle.cpu_model import tensor_shapes

KNOWN_OPS = {"rmsnorm", "linear", "rope", "attention", "add", "gelu", "argmax"}
MAX_ARENA_BYTES = 64 * 1024 ** 3


class GraphError(ValueError):
    """The graph or config cannot be compiled."""


class LayoutChanged(GraphError):
    """The config implies other weight tensors (names or shapes) than the arena to bind."""


@dataclass
class Variant:
    name: str
    batch: int
    seq: int
    cos: np.ndarray  # [seq, head_dim/2]
    sin: np.ndarray
    mask: np.ndarray  # [seq, seq] additive causal mask
    kv: np.ndarray  # [layers, 2, batch, seq, heads, head_dim]


@dataclass
class CompiledGraph:
    digest: str
    config: dict
    variants: list[Variant] = field(default_factory=list)
    weights: dict[str, np.ndarray] = field(default_factory=dict)  # views into one arena

    @property
    def head_dim(self) -> int:
        return self.config["d_model"] // self.config["n_heads"]

    def variant_for(self, length: int) -> Variant:
        """The smallest variant whose sequence length holds ``length`` tokens."""
        fits = [v for v in self.variants if v.seq >= length]
        if not fits:
            longest = max(v.seq for v in self.variants)
            raise GraphError(f"{length} tokens exceed the longest compiled variant ({longest})")
        return min(fits, key=lambda v: (v.seq, v.batch))


def _check_config(config: dict) -> None:
    need = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "norm_eps", "rope_theta")
    missing = [k for k in need if k not in config]
    if missing:
        raise GraphError(f"config.json misses {', '.join(missing)}")
    if config["d_model"] % config["n_heads"] or (config["d_model"] // config["n_heads"]) % 2:
        raise GraphError("d_model must split into heads of an even head dimension")


def _check_ops(graph: dict, config: dict) -> None:
    if graph.get("format") != "resident-cpu-graph/v1":
        raise GraphError(f"graph format {graph.get('format')!r} is not resident-cpu-graph/v1")
    layers = graph.get("layers", [])
    if len(layers) != config["n_layers"]:
        raise GraphError(f"graph has {len(layers)} layers, config says {config['n_layers']}")
    for i, layer in enumerate(layers):
        for op in layer["ops"] + (graph["head"] if i == 0 else []):
            if op.split(":", 1)[0] not in KNOWN_OPS:
                raise GraphError(f"layer {i}: unknown op {op!r}")


def _variant(spec: dict, config: dict, spare: dict[tuple, list[np.ndarray]]) -> Variant:
    """Lower one variant; its KV arena is one of ``spare`` (an earlier graph's arenas, by
    shape) when one has its shape, else a new one."""
    batch, seq = int(spec["batch"]), int(spec["seq"])
    if batch < 1 or seq < 1:
        raise GraphError(f"variant {spec.get('name')!r}: batch and seq must be positive")
    if seq > config.get("max_seq", seq):
        raise GraphError(f"variant {spec.get('name')!r}: seq {seq} exceeds the model's max_seq {config['max_seq']}")
    d, heads, layers = config["d_model"], config["n_heads"], config["n_layers"]
    hd = d // heads
    if layers * 2 * batch * seq * d * 4 > MAX_ARENA_BYTES:
        raise GraphError(f"variant {spec.get('name')!r}: KV arena over {MAX_ARENA_BYTES} bytes")
    inv = np.float32(config["rope_theta"]) ** (-np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd))
    angles = np.arange(seq, dtype=np.float32)[:, None] * inv[None, :]
    mask = np.triu(np.full((seq, seq), -np.inf, dtype=np.float32), k=1)
    shape = (layers, 2, batch, seq, heads, hd)
    if spare.get(shape):
        kv = spare[shape].pop()  # scratch: a request writes each position before it reads it
    else:
        kv = np.empty(shape, dtype=np.float32)
        kv.fill(0.0)  # touch every page now, not during the first request
    return Variant(str(spec.get("name", f"b{batch}-s{seq}")), batch, seq,
                   np.cos(angles), np.sin(angles), mask, kv)


def _check_binds(config: dict, arena: dict[str, np.ndarray]) -> None:
    """Raise LayoutChanged unless ``arena`` holds exactly the float32 tensors ``config`` implies."""
    implied = {name: tuple(shape) for name, shape in tensor_shapes(config)}
    held = {name: a.shape for name, a in arena.items() if a.dtype == np.float32}
    if implied != held:
        differ = sorted(set(implied.items()) ^ set(held.items()))
        raise LayoutChanged(f"the config implies other weight tensors than the live arena holds "
                            f"({len(differ)} names or shapes differ, e.g. {differ[0][0]})")


def _weight_arena(config: dict) -> dict[str, np.ndarray]:
    """One float32 buffer for every tensor the config implies, as named views. Not touched
    here: a load writes every value of it (a tensor it lacks is an error), widening on
    every core, so the pages' first touch is spread over the cores too (a fill on one
    thread first made a 1 GiB load slower: docs/owner.md)."""
    shapes = tensor_shapes(config)
    total = sum(math.prod(shape) for _, shape in shapes)
    if total * 4 > MAX_ARENA_BYTES:
        raise GraphError(f"weights of {total} parameters exceed the {MAX_ARENA_BYTES}-byte arena limit")
    arena = np.empty(total, dtype=np.float32)
    views, at = {}, 0
    for name, shape in shapes:
        n = math.prod(shape)
        views[name] = arena[at:at + n].reshape(shape)
        at += n
    return views


def compile_graph(graph_bytes: bytes, config_bytes: bytes, digest: str,
                  bind: CompiledGraph | None = None) -> CompiledGraph:
    """Parse, check and lower the graph for every variant it names. ``bind``: an earlier
    graph over the same weights, whose weight arena the new graph takes instead of
    allocating one (:class:`LayoutChanged`, before anything is allocated, if the config
    implies other tensors than it holds), and whose KV arenas it takes for variants of
    the same shape. The earlier graph must not run once the new one does (they share
    scratch memory); nothing of it is written here, so it may run if this fails."""
    try:
        graph, config = json.loads(graph_bytes), json.loads(config_bytes)
    except ValueError as e:
        raise GraphError(f"graph or config is not JSON: {e}") from None
    try:
        _check_config(config)
        _check_ops(graph, config)
        if bind is not None:
            _check_binds(config, bind.weights)
        specs = graph["variants"]
        if not specs:
            raise GraphError("graph names no variants")
        spare: dict[tuple, list[np.ndarray]] = {}
        for v in bind.variants if bind is not None else []:
            spare.setdefault(v.kv.shape, []).append(v.kv)
        return CompiledGraph(digest, config, [_variant(s, config, spare) for s in specs],
                             bind.weights if bind is not None else _weight_arena(config))
    except (KeyError, TypeError) as e:
        raise GraphError(f"graph or config is malformed: missing or wrong {e}") from None
