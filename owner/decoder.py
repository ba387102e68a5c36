"""A small decoder-only transformer in numpy: the cpu backend's model.

Pre-norm blocks (RMSNorm, multi-head attention with rotary positions, GELU MLP), a final
norm and an LM head; greedy decoding. Weights arrive as BF16 and are widened exactly to
float32 once, at load, into the compiled graph's weight buffers; every step is plain
float32 numpy, so the same weights and the same prompt give bitwise the same logits on the
same machine. The KV cache lives in the compiled variant's arena, so a request never
allocates it.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from .graph import CompiledGraph, Variant


if sys.byteorder != "little":  # the cpu backend reads BF16 back as the high half-word of each float
    raise ImportError("the cpu backend needs a little-endian machine")


def bf16_to_f32(bits: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Widen BF16 bit patterns (uint16) to float32, exactly: they become the high 16 bits.
    ``out`` (float32, same number of elements) receives them instead of a new array."""
    if out is None:
        out = np.empty(bits.shape, dtype=np.float32)
    elif out.dtype != np.float32 or out.size != bits.size:
        raise ValueError(f"cannot widen {bits.size} BF16 values into a {out.dtype} array of {out.size}")
    words = out.view(np.uint32).reshape(bits.shape)
    words[...] = bits  # one contiguous widening pass, no temporary
    words <<= np.uint32(16)
    return out


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: np.float32) -> np.ndarray:
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    return (x / np.sqrt(ms + eps)) * w


def _gelu(x: np.ndarray) -> np.ndarray:
    c = np.float32(math.sqrt(2.0 / math.pi))
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)


@dataclass
class Generation:
    tokens: list[int]
    logits: list[np.ndarray] = field(repr=False)
    first_token_seconds: float
    variant: str


class Decoder:
    """Runs the weights (name -> float32 array) through a compiled graph."""

    def __init__(self, weights: dict[str, np.ndarray], graph: CompiledGraph):
        self.w = weights
        self.graph = graph
        c = graph.config
        self.layers, self.heads = c["n_layers"], c["n_heads"]
        self.hd = c["d_model"] // c["n_heads"]
        self.eps = np.float32(c["norm_eps"])
        self.scale = np.float32(1.0 / math.sqrt(self.hd))

    def _step(self, tokens: list[int], pos: int, v: Variant) -> np.ndarray:
        """Run ``tokens`` at positions pos.. through every layer; logits of the last one."""
        w, n, hd = self.w, len(tokens), self.hd
        x = w["embed.weight"][np.asarray(tokens)]
        cos, sin = v.cos[pos:pos + n], v.sin[pos:pos + n]
        for i in range(self.layers):
            p = f"layers.{i}."
            h = _rmsnorm(x, w[p + "attn_norm.weight"], self.eps)
            q = (h @ w[p + "attn.q_proj.weight"].T).reshape(n, self.heads, hd)
            k = (h @ w[p + "attn.k_proj.weight"].T).reshape(n, self.heads, hd)
            val = (h @ w[p + "attn.v_proj.weight"].T).reshape(n, self.heads, hd)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            v.kv[i, 0, 0, pos:pos + n] = k
            v.kv[i, 1, 0, pos:pos + n] = val
            keys, values = v.kv[i, 0, 0, :pos + n], v.kv[i, 1, 0, :pos + n]
            scores = (q.transpose(1, 0, 2) @ keys.transpose(1, 2, 0)) * self.scale
            scores = scores + v.mask[pos:pos + n, :pos + n]
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            att = (scores @ values.transpose(1, 0, 2)).transpose(1, 0, 2).reshape(n, self.heads * hd)
            x = x + att @ w[p + "attn.o_proj.weight"].T
            h = _rmsnorm(x, w[p + "mlp_norm.weight"], self.eps)
            x = x + _gelu(h @ w[p + "mlp.up_proj.weight"].T) @ w[p + "mlp.down_proj.weight"].T
        last = _rmsnorm(x[-1:], w["final_norm.weight"], self.eps)
        return (last @ w["lm_head.weight"].T)[0]

    def steps(self, prompt: list[int], max_tokens: int, variant: Variant | None = None
              ) -> Iterator[tuple[int, np.ndarray]]:
        """Greedy decoding, one (token, logits) at a time as each is produced."""
        if not prompt:
            raise ValueError("the prompt must contain at least one token")
        v = variant or self.graph.variant_for(len(prompt) + max_tokens)
        if len(prompt) + max_tokens > v.seq:
            raise ValueError(f"{len(prompt)}+{max_tokens} tokens do not fit variant {v.name}")
        logits = self._step(prompt, 0, v)
        token = int(np.argmax(logits))
        yield token, logits
        for i in range(1, max_tokens):
            logits = self._step([token], len(prompt) + i - 1, v)
            token = int(np.argmax(logits))
            yield token, logits

    def generate(self, prompt: list[int], max_tokens: int, variant: Variant | None = None) -> Generation:
        """Greedy decoding of ``max_tokens`` tokens after ``prompt``."""
        v = variant or self.graph.variant_for(len(prompt) + max_tokens)
        t0 = time.perf_counter()
        out, logits, first = [], [], 0.0
        for token, row in self.steps(prompt, max_tokens, v):
            if not out:
                first = time.perf_counter() - t0
            out.append(token)
            logits.append(row)
        return Generation(out, logits, first, v.name)
