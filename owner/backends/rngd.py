"""FuriosaAI RNGD adapter over ``furiosa_llm`` (imported lazily; untested on hardware).

The revision directory is expected to hold a Furiosa-LLM artifact (built with the
vendor's ArtifactBuilder); it is opened with ``LLM.load_artifact`` on ``npu:0``, the one
card the device plugin gave this Pod.
"""

from __future__ import annotations

from ..revisions import Revision
from .vendor import VendorBackend


class RngdBackend(VendorBackend):
    name = "rngd"
    sdk_module = "furiosa_llm"
    sdk_hint = "pip install furiosa-llm, with the RNGD driver and a furiosa.ai/rngd device"

    def _open(self, revision: Revision):
        return self.sdk.LLM.load_artifact(str(revision.dir), devices="npu:0")

    def _run(self, prompt: str, max_tokens: int) -> tuple[list[int], str]:
        params = self.sdk.SamplingParams(max_tokens=max_tokens, temperature=0.0)
        out = self.engine.generate([prompt], params)[0].outputs[0]
        return list(out.token_ids), out.text
