"""Demo checkpoints in Hugging Face form, for the owner's torch backend.

``make_hf_demo`` writes what a user would download from a model hub, generated here
instead: a Llama-style causal LM (grouped-query attention, SwiGLU MLP, RMSNorm, untied LM
head) randomly initialized by ``transformers`` from a seed and saved with
``save_pretrained`` as BF16 ``model.safetensors`` + ``config.json`` +
``generation_config.json``, and a real byte-level BPE tokenizer trained by ``tokenizers``
on a built-in corpus (``tokenizer.json``, loaded back as ``PreTrainedTokenizerFast``).
The default role rules of :mod:`bundle.scan` give the files their roles, so nothing here
is special to the bundle machinery: ``resident bundle build`` on such a directory gives
the same manifest.

Revisions (``make_hf_revision``) model the three kinds of change a transition meets, as
for the cpu format (:mod:`bundle.model_revisions`): ``rows`` rewrites a fraction of the
rows of the projection and LM-head tensors (:func:`bundle.model_revisions.rows_revision`,
the same for both formats), ``graph`` changes
config.json only (``max_position_embeddings`` doubles: the weights stay byte-identical,
the module must be built anew) and ``whole`` draws every weight again.

It needs the optional ``torch`` extra; without it a :class:`DemoError` says so.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from .model_revisions import REVISION_KINDS, WEIGHTS_NAME, DemoError, copy_base, rows_revision, seal
from .manifest import DEFAULT_CHUNK_SIZE, MANIFEST_NAME, Manifest

VOCAB = 512
END = "<|endoftext|>"
WORDS = ("model revision weights bundle owner card resident transition reload place rows chunk "
         "digest node store lease graph config token layer head attention the a of to in is "
         "and fast slow new old every one two").split()


def _libraries():
    try:
        import tokenizers
        import torch
        import transformers
    except ImportError as e:
        raise DemoError(f"--format hf needs the torch extra (pip install 'resident[torch]'): {e}") from None
    transformers.utils.logging.disable_progress_bar()
    return torch, transformers, tokenizers


def corpus(lines: int = 400) -> list[str]:
    """Deterministic sentences over a small vocabulary (the tokenizer's training text)."""
    n = len(WORDS)
    return [" ".join(WORDS[(i * 7 + j * j * 3 + j) % n] for j in range(5 + i % 9)) + f" {i}."
            for i in range(lines)]


def write_tokenizer(out: Path) -> int:
    """Train a byte-level BPE tokenizer on :func:`corpus`; write it; return its vocab size."""
    _, _, tk = _libraries()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[END], show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": END, "eos_token": END,
         "model_max_length": 4096}, indent=2, sort_keys=True) + "\n")
    return tok.get_vocab_size()


def choose_hf_config(size_bytes: int, vocab: int) -> dict:
    """Llama hyper-parameters whose BF16 weights take about ``size_bytes``.

    Per layer 12 d^2 parameters (q, o: d^2 each; k, v at half the heads; MLP 3 x d x 3d),
    plus 2 x vocab x d for the untied embedding and LM head."""
    if size_bytes < 256 * 1024:
        raise DemoError(f"size {size_bytes} bytes is too small for an hf demo model (min 256 KiB)")
    params = size_bytes // 2
    layers_target = 2 if params < 8_000_000 else (4 if params < 128_000_000 else 8)
    d = max(64, 64 * round(math.sqrt(params / (12 * layers_target)) / 64))
    head_dim = 16 if d < 256 else 64
    d += head_dim * ((d // head_dim) % 2)  # an even number of heads: half of them share K/V
    heads = d // head_dim
    layers = max(1, round((params - 2 * vocab * d) / (12 * d * d)))
    return {"vocab_size": vocab, "hidden_size": d, "intermediate_size": 3 * d,
            "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": max(1, heads // 2), "head_dim": head_dim,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
            "initializer_range": 0.1, "bos_token_id": 0, "eos_token_id": 0}


def write_weights(out: Path, params: dict, seed: int) -> None:
    """Random-init a LlamaForCausalLM from ``params`` (seeded) and save it in BF16."""
    torch, transformers, _ = _libraries()
    config = transformers.LlamaConfig(**params)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out, max_shard_size="1000GB")


def make_hf_demo(out_dir: Path | str, size_bytes: int, seed: int = 0,
                 chunk_size: int = DEFAULT_CHUNK_SIZE) -> Manifest:
    """Generate an hf demo checkpoint of about ``size_bytes`` of weights in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any(p.name != MANIFEST_NAME for p in out.iterdir()):
        raise DemoError(f"{out} is not empty; refusing to overwrite an existing bundle")
    try:
        vocab = write_tokenizer(out)
        write_weights(out, choose_hf_config(size_bytes, vocab), seed)
        return seal(out, chunk_size)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise


def is_hf_checkpoint(base: Path | str) -> bool:
    """True for a directory whose config.json is a transformers config, not the numpy demo's."""
    try:
        config = json.loads((Path(base) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return config.get("model_type") not in (None, "resident-demo")


def make_hf_revision(base_dir: Path | str, out_dir: Path | str, kind: str, fraction: float = 0.005,
                     seed: int = 1, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Manifest:
    """Derive a revision of the hf demo checkpoint ``base_dir`` into ``out_dir`` (see above)."""
    if kind == "rows":
        return rows_revision(base_dir, out_dir, fraction, seed, chunk_size=chunk_size)
    if kind not in REVISION_KINDS:
        raise DemoError(f"kind {kind!r} is not one of {', '.join(REVISION_KINDS)}")
    base, out = Path(base_dir), Path(out_dir)
    if not is_hf_checkpoint(base):
        raise DemoError(f"{base} is not a Hugging Face checkpoint (config.json has no model_type)")
    copy_base(base, out)
    try:
        config = json.loads((out / "config.json").read_text())
        if kind == "graph":
            config["max_position_embeddings"] = 2 * int(config["max_position_embeddings"])
            (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        else:
            keys = set(choose_hf_config(256 * 1024, VOCAB))
            (out / WEIGHTS_NAME).unlink()
            write_weights(out, {k: v for k, v in config.items() if k in keys}, seed + 1_000_003)
        return seal(out, chunk_size)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
