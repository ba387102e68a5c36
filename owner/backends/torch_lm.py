"""The torch backend: Hugging Face causal LMs (Llama, Qwen2, GPT-2, ...) run by transformers.

A revision is a checkpoint directory as a model hub serves it: ``config.json`` (and
``generation_config.json``), ``*.safetensors`` and the tokenizer files. Loading
hash-checks every file against the manifest, then checks the checkpoint against the
module its config describes, built on the ``meta`` device (no memory, no init):
every tensor must be one the module has, of its shape, and every parameter must be
provided (:func:`owner.torch_weights.bind`). Only then ``from_pretrained`` loads it,
in the checkpoint's dtype, local files only and no remote code, and moves it to the
device (on the CPU, out of the file mapping into the owner's own memory); the tokenizer is the checkpoint's own (``AutoTokenizer``). An unknown
architecture, a config that does not match the tensors or missing tokenizer files are
clear :class:`BackendError`\\ s at load, so the owner never becomes ready on them.

Generation is ``model.generate(do_sample=False)``: greedy and deterministic, the same
call a user would make on the same checkpoint. The first-token check (warm-up, and after a
transition) starts from a token id, not from text: the model's BOS (or EOS, or 0), since a
checkpoint's tokenizer may encode a short text to no tokens and may add no BOS (GPT-2's).
In place (B2) goes through the shared admission and journal (:mod:`owner.admission`,
:mod:`owner.inplace`) over the live parameters (:class:`owner.torch_weights.LiveWeights`),
for rows held in their file's dtype (BF16, F16 or F32). A reload whose target has the same
graph digest (the config files) keeps the module and copies the new tensors into its
parameters; otherwise it builds a new one. torch is imported here only, so without the
``torch`` extra the backend is :class:`BackendUnavailable` and nothing else changes.
"""

from __future__ import annotations

import gc
import os
import queue
import threading
import time
from typing import Iterator

from bundle.manifest import Role

from .. import admission
from ..inplace import ApplyReport, StagedUpdate
from ..revisions import Revision, read_verified
from .base import (
    BackendError, BackendUnavailable, Description, LoadReport, Output, Piece, Residency, apply_and_advance,
)

try:
    import torch
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a revision is local; never ask a hub
    import transformers
    from transformers.generation.streamers import BaseStreamer
except ImportError as e:
    raise BackendUnavailable(f"the torch backend needs the 'torch' extra "
                             f"(pip install 'resident[torch]'): {e}") from None

from ..torch_weights import LiveWeights, WeightsMismatch, bind, weights_layouts  # noqa: E402

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
VARIANT = "greedy"


class _FirstToken(BaseStreamer):
    """Notes when generate hands over its first new token (its first call is the prompt)."""

    def __init__(self) -> None:
        self.calls, self.at = 0, None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:
            self.at = time.perf_counter()

    def end(self) -> None:
        pass


class _Handover(BaseStreamer):
    """Queues the new tokens of each generate step for another thread (not the prompt)."""

    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()
        self.calls = 0

    def put(self, value) -> None:
        self.calls += 1
        if self.calls > 1:
            self.queue.put(value.reshape(-1).tolist())

    def end(self) -> None:
        pass


class _Stop(transformers.StoppingCriteria):
    """Ends generate at its next step once the reader has gone."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


class TorchBackend:
    name = "torch"
    live_weights = LiveWeights  # the RowStore class (tests inject faults by subclassing it)

    def __init__(self, device: str = "cpu", verify_chunks: bool = False) -> None:
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise BackendUnavailable(f"device {device}: torch {torch.__version__} sees no CUDA device")
        try:
            self.device = torch.device(device)
        except RuntimeError as e:
            raise BackendError(f"device {device!r}: {e}") from None
        self.verify_chunks = verify_chunks
        self.revision: Revision | None = None
        self.model = None
        self.tokenizer = None
        self.live: LiveWeights | None = None
        self.residency: Residency | None = None

    # -- lifecycle ---------------------------------------------------------------
    def load(self, revision: Revision) -> LoadReport:
        if self.revision is not None:
            raise BackendError("a revision is already loaded; use reload")
        return self._load(revision, keep=None)

    def reload(self, revision: Revision) -> LoadReport:
        """Close the old runtime first; keep its module if the graph digest matches."""
        same = self.revision is not None and self.revision.manifest.graph_digest == revision.manifest.graph_digest
        keep = (self.model, self.live) if same else None
        self.close()
        return self._load(revision, keep)

    def close(self) -> None:
        self.revision, self.model, self.tokenizer, self.live, self.residency = None, None, None, None, None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _load(self, rev: Revision, keep) -> LoadReport:
        t0, compile_seconds = time.perf_counter(), 0.0
        if not rev.manifest.files_with(Role.tokenizer):
            raise BackendError("the checkpoint has no tokenizer files (tokenizer.json, ...)")
        try:
            for entry in rev.manifest.files_with(Role.config, Role.tokenizer, Role.graph):
                read_verified(rev, entry)  # small files; transformers reads them by path next
            if keep is not None:
                model, live = keep
                live.load_files(rev)
            else:
                layouts = weights_layouts(rev)
                t1 = time.perf_counter()
                config = transformers.AutoConfig.from_pretrained(rev.dir, local_files_only=True)
                with torch.device("meta"):
                    bind(transformers.AutoModelForCausalLM.from_config(config), layouts)
                compile_seconds = time.perf_counter() - t1
                model = self._from_pretrained(rev, config)
                live = self.live_weights(layouts, bind(model, layouts))
            tokenizer = transformers.AutoTokenizer.from_pretrained(rev.dir, local_files_only=True)
        except WeightsMismatch as e:
            raise BackendError(f"checkpoint does not match its config: {e}") from None
        except (ValueError, OSError, KeyError, RuntimeError) as e:  # what transformers raises for bad input
            raise BackendError(f"cannot load the checkpoint: {type(e).__name__}: {e}") from None
        self.model, self.live, self.tokenizer, self.revision = model, live, tokenizer, rev
        self.residency = _residency(model, self.device)
        total = time.perf_counter() - t0
        return LoadReport(total - compile_seconds, compile_seconds, keep is not None)

    def _from_pretrained(self, rev: Revision, config):
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            rev.dir, config=config, dtype="auto", local_files_only=True, trust_remote_code=False,
            output_loading_info=True)
        wrong = {k: sorted(map(str, v)) for k, v in info.items() if k != "error_msgs" and v}
        if wrong:
            raise WeightsMismatch(f"transformers reports {wrong}")
        model = model.to(self.device).eval().requires_grad_(False)
        if self.device.type == "cpu":
            _own_memory(model)
        return model

    # -- serving -----------------------------------------------------------------
    def describe(self) -> Description:
        ident = self.revision.manifest.identity() if self.revision else None
        return Description(self.name, True, ident, tuple(self.variants()), self.residency)

    def variants(self) -> list[str]:
        return [VARIANT] if self.model is not None else []

    def _encode(self, prompt: str, max_tokens: int):
        """The prompt as model inputs on the device, and its length in tokens; checked."""
        if self.model is None:
            raise BackendError("no model is loaded")
        enc = self.tokenizer(prompt, return_tensors="pt").to(self.device)
        n = enc["input_ids"].shape[1]
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if n == 0:
            raise BackendError("the prompt encodes to no tokens")
        if limit and n + max_tokens > limit:
            raise BackendError(f"{n} prompt tokens + {max_tokens} new exceed the model's {limit} positions")
        return enc, n

    def generate(self, prompt: str, max_tokens: int, variant: str | None = None) -> Output:
        if variant not in (None, VARIANT):
            raise BackendError(f"no variant named {variant!r} (the torch backend has {VARIANT!r})")
        enc, n = self._encode(prompt, max_tokens)
        first = _FirstToken()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(**enc, max_new_tokens=max_tokens, do_sample=False,
                                      streamer=first)
        tokens = out[0, n:].tolist()
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return Output(tokens, text, (first.at or time.perf_counter()) - t0, prompt_tokens=n)

    def first_token(self, variant: str | None = None) -> Output:
        """One greedy token after :meth:`start_token`, whatever the tokenizer makes of text."""
        if variant not in (None, VARIANT):
            raise BackendError(f"no variant named {variant!r} (the torch backend has {VARIANT!r})")
        if self.model is None:
            raise BackendError("no model is loaded")
        ids = torch.tensor([[self.start_token()]], device=self.device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      max_new_tokens=1, do_sample=False)
        tokens = out[0, 1:].tolist()
        return Output(tokens, self.tokenizer.decode(tokens), time.perf_counter() - t0, prompt_tokens=1)

    def start_token(self) -> int:
        """A token id to generate from without text: the model's BOS, else its EOS (from the
        generation config, the config, then the tokenizer), else 0."""
        vocab = self.model.get_input_embeddings().num_embeddings
        for attr in ("bos_token_id", "eos_token_id"):
            for holder in (self.model.generation_config, self.model.config, self.tokenizer):
                value = getattr(holder, attr, None)
                value = value[0] if isinstance(value, (list, tuple)) and value else value
                if isinstance(value, int) and 0 <= value < vocab:
                    return value
        return 0

    def generate_stream(self, prompt: str, max_tokens: int) -> Iterator[Piece]:
        """The same greedy ``generate``, run on a thread that hands over each new token; a
        piece's text is what the tokens so far decode to beyond the last piece's (held back
        while it ends inside a character), so the pieces join to ``generate``'s text.
        Closing the iterator early stops the generation at its next step."""
        enc, n = self._encode(prompt, max_tokens)
        handed, stop, failed = _Handover(), threading.Event(), []

        def run() -> None:
            try:
                with torch.inference_mode():
                    self.model.generate(**enc, max_new_tokens=max_tokens, do_sample=False, streamer=handed,
                                        stopping_criteria=transformers.StoppingCriteriaList([_Stop(stop)]))
            except Exception as e:  # noqa: BLE001 - raised to the reader below
                failed.append(e)
            handed.queue.put(None)

        thread = threading.Thread(target=run, name="torch-generate", daemon=True)
        thread.start()
        tokens, pending, said = [], [], ""
        try:
            while (new := handed.queue.get()) is not None:
                tokens += new
                pending += new
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                if not text.endswith("\ufffd") and text.startswith(said):
                    yield Piece(pending, text[len(said):], n)
                    pending, said = [], text
            if failed:
                raise BackendError(f"generation failed: {type(failed[0]).__name__}: {failed[0]}")
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            if pending or text != said:
                yield Piece(pending, text[len(said):] if text.startswith(said) else "", n)
        finally:
            stop.set()
            thread.join()

    # -- in place ----------------------------------------------------------------
    def stage_in_place(self, revision: Revision) -> StagedUpdate:
        if self.revision is None:
            raise BackendError("no model is loaded")
        return admission.stage(self.live, self.revision.manifest, revision)

    def apply_in_place(self, update: StagedUpdate) -> ApplyReport:
        return apply_and_advance(self, self.live, update, self.verify_chunks)


def _own_memory(model) -> None:
    """Copy every parameter into the process's own memory, one tensor at a time.

    On the CPU ``from_pretrained`` leaves parameters backed by a private map of the
    revision's safetensors file: pages are read from the volume when first used and may be
    dropped and read again under memory pressure, and the first write to each page (a reload
    into the kept module) copies it. A resident model holds its weights itself. Tied
    parameters are one Parameter object, so they stay tied."""
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.clone()


def _residency(model, device) -> Residency:
    """Bytes of every distinct storage the module's parameters and buffers hold."""
    storages = {}
    for t in list(model.parameters()) + list(model.buffers()):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return Residency(str(device), str(model.dtype).removeprefix("torch."), sum(storages.values()))
