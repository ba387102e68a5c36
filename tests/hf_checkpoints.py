"""Test-only: tiny Hugging Face checkpoints of three families, built here (random init through
transformers, the demo's trained BPE tokenizer), and transformers' own greedy generate
as the reference the torch backend must equal. Also tiny Llama checkpoints as a user meets
them: saved by transformers in F32, F16 or BF16, with a small BPE tokenizer that adds a BOS
or (as GPT-2's) none, and revisions of them made by editing rows through transformers.
Nothing outside tests/ imports this."""

import json
import shutil

import torch

from bundle.hf_demo import END, corpus, write_tokenizer
from bundle.model_revisions import WEIGHTS_NAME, copy_base, seal
from bundle.scan import build_manifest, write_manifest
from owner.backends.base import BackendError
from owner.backends.torch_lm import TorchBackend
from owner.torch_weights import LiveWeights

from fault_backends import FlipsFirstWrite

PROMPT = "the model revision"


def family_checkpoint(out, family: str, seed: int = 0, chunk_size: int = 64 * 1024):
    """A tiny Qwen2 (tied embeddings, BF16) or GPT-2 (F32) checkpoint with its manifest."""
    import torch
    import transformers

    out.mkdir(parents=True)
    vocab = write_tokenizer(out)
    if family == "qwen2":
        config = transformers.Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=128, tie_word_embeddings=True,
                                          initializer_range=0.1, bos_token_id=0, eos_token_id=0)
        dtype = torch.bfloat16
    else:
        config = transformers.GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                         initializer_range=0.1, bos_token_id=0, eos_token_id=0)
        dtype = torch.float32
    torch.manual_seed(seed)
    transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).save_pretrained(out)
    write_manifest(out, build_manifest(out, chunk_size=chunk_size))
    return out


def transformers_greedy(checkpoint, prompt: str = PROMPT, max_tokens: int = 12) -> list[int]:
    """What a user gets from transformers itself on the checkpoint directory."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype="auto")
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(checkpoint / "tokenizer.json"))
    enc = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=max_tokens, do_sample=False)
    return out[0, enc["input_ids"].shape[1]:].tolist()


DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
BITS = {2: torch.int16, 4: torch.int32}  # a tensor's values as integers of their width


def small_bpe_tokenizer(out, adds_bos: bool) -> int:
    """A byte-level BPE trained here on the demo corpus, as GPT-2's was made, saved with its
    tokenizer_config.json; returns its vocabulary size. It is trained without the full byte
    alphabet, so a character the corpus lacks (a newline) has no token and encodes to
    nothing. ``adds_bos`` puts the BOS token first in every encoding, as Llama's tokenizer
    does; without it none is added, as with GPT-2's."""
    import tokenizers as tk

    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    tok.train_from_iterator(corpus(), tk.trainers.BpeTrainer(vocab_size=300, special_tokens=[END],
                                                             show_progress=False))
    if adds_bos:
        tok.post_processor = tk.processors.TemplateProcessing(single=f"{END} $A",
                                                              special_tokens=[(END, tok.token_to_id(END))])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": END, "eos_token": END}, indent=2) + "\n")
    return tok.get_vocab_size()


def llama_checkpoint(out, dtype: str, adds_bos: bool, seed: int = 0, chunk_size: int = 64 * 1024):
    """A tiny Llama (untied LM head) random-initialized by transformers and saved with
    ``save_pretrained`` in ``dtype`` (F32, F16 or BF16), with :func:`small_bpe_tokenizer`."""
    import transformers

    out.mkdir(parents=True)
    vocab = small_bpe_tokenizer(out, adds_bos)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=128, tie_word_embeddings=False,
                                      initializer_range=0.1, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    transformers.AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype]).save_pretrained(out)
    seal(out, chunk_size)
    return out


def rows_edited(base, out, head_rows: list[int], seed: int = 1, chunk_size: int = 64 * 1024):
    """A revision of ``base`` made as a user makes one: transformers loads it in its own dtype,
    the LM head's ``head_rows`` are negated and scaled (those tokens become unlikely) and two
    seeded rows of every ``down_proj`` are drawn anew, and ``save_pretrained`` writes the
    weights again; every other file is the base's."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype="auto")
    draw = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head = model.lm_head.weight
        head[head_rows] = head[head_rows] * -4
        for layer in model.model.layers:
            w = layer.mlp.down_proj.weight
            rows = torch.randint(0, w.shape[0], (2,), generator=draw)
            w[rows] = (torch.randn(len(rows), w.shape[1], generator=draw) * 0.1).to(w.dtype)
    saved = out.with_name(out.name + "-saved")
    model.save_pretrained(saved)
    copy_base(base, out)
    shutil.copyfile(saved / WEIGHTS_NAME, out / WEIGHTS_NAME)
    shutil.rmtree(saved)
    seal(out, chunk_size)
    return out


def rows_that_differ(a_dir, b_dir) -> dict[str, list[int]]:
    """{tensor: rows whose bytes differ} between two checkpoints' weights files, read with
    safetensors itself (a 1-D tensor that differs counts as its row 0)."""
    from safetensors.torch import load_file

    a, b = load_file(a_dir / WEIGHTS_NAME), load_file(b_dir / WEIGHTS_NAME)
    out = {}
    for name, x in a.items():
        y = b[name]
        differs = x.view(BITS[x.element_size()]) != y.view(BITS[y.element_size()])
        rows = differs.reshape(differs.shape[0], -1).any(dim=1) if x.dim() > 1 else differs.any().reshape(1)
        if rows.any():
            out[name] = rows.nonzero().flatten().tolist()
    return out


class FirstTokenFailsOnce(TorchBackend):
    """Test-only fault: the first-token check right after the first in-place apply or
    reload fails, as a model that answers no token would; later checks pass."""

    armed = failed = False

    def apply_in_place(self, update):
        report = super().apply_in_place(update)
        self.armed = not self.failed
        return report

    def reload(self, revision):
        report = super().reload(revision)
        self.armed = not self.failed
        return report

    def first_token(self, variant=None):
        if self.armed:
            self.armed, self.failed = False, True
            raise BackendError("injected: the model answered no token")
        return super().first_token(variant)


class FlipFirstWriteWeights(FlipsFirstWrite, LiveWeights):
    """Test-only fault: the first row block an in-place update writes has one bit flipped,
    so read-back verification fails and the journal must restore the old rows."""


class FailRestoreWeights(FlipFirstWriteWeights):
    """Test-only fault: as above, and every write after the read-back began (the restore)
    fails, so the owner must unload."""

    reading_back = False

    def read_rows(self, name, rows):
        self.reading_back = self.reading_back or self.writes > 0
        return super().read_rows(name, rows)

    def write_rows(self, name, rows, values):
        if self.reading_back:
            raise OSError("injected: device refused the restoring write")
        super().write_rows(name, rows, values)


class FailReleaseWeights(LiveWeights):
    """Test-only fault: the update applies and verifies, but releasing staged memory fails."""

    def release_staged(self, update):
        raise RuntimeError("injected: staged buffer still pinned")


class StrayWriteWeights(LiveWeights):
    """Test-only fault: the first write also flips a bit in the row after the rows it
    writes, a row the journal does not hold; only chunk verification can see it."""

    strays = 0

    def write_rows(self, name, rows, values):
        super().write_rows(name, rows, values)
        row = int(rows.max()) + 1
        if not self.strays and row < self.bound[name].shape[0]:
            self.strays += 1
            self.bound[name].view(torch.int16)[row, 0] ^= 1
