"""Test-only: tiny Hugging Face checkpoints of three families, built here (random init through
transformers, the demo's trained BPE tokenizer), and transformers' own greedy generate
as the reference the torch backend must equal. Nothing outside tests/ imports this."""

import torch

from bundle.hf_demo import write_tokenizer
from bundle.scan import build_manifest, write_manifest
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
