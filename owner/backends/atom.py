"""Rebellions ATOM adapter over ``optimum.rbln`` (imported lazily; untested on hardware).

The revision directory is expected to hold a model compiled by the RBLN compiler
(``export=False`` loads it without compiling) and a Hugging Face tokenizer; it runs on
device 0, the one card the device plugin gave this Pod.
"""

from __future__ import annotations

import importlib

from ..revisions import Revision
from .base import BackendUnavailable
from .vendor import VendorBackend


class AtomBackend(VendorBackend):
    name = "atom"
    sdk_module = "optimum.rbln"
    sdk_hint = "pip install optimum-rbln, with the RBLN driver and a rebellions.ai/ATOM device"

    def _open(self, revision: Revision):
        try:
            transformers = importlib.import_module("transformers")
        except ImportError as e:
            raise BackendUnavailable(f"the atom backend needs 'transformers' for the tokenizer: {e}") from None
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(revision.dir))
        return self.sdk.RBLNAutoModelForCausalLM.from_pretrained(str(revision.dir), export=False, rbln_device=0)

    def _run(self, prompt: str, max_tokens: int) -> tuple[list[int], str]:
        ids = self.tokenizer(prompt, return_tensors="pt")
        out = self.engine.generate(**ids, max_new_tokens=max_tokens, do_sample=False)
        new = [int(t) for t in out[0][ids["input_ids"].shape[-1]:]]
        return new, self.tokenizer.decode(new, skip_special_tokens=True)
