"""Wire models of the inference port: the subset of OpenAI's completions and models API
the owner serves (see docs/owner.md, "Inference API").

Requests accept OpenAI's field names; the sampling fields are accepted and ignored
(decoding is greedy), and a field whose value the owner cannot honour (``n`` > 1,
``echo``, ``logprobs``, ``stop``, ``suffix``, ...) is refused with 400 rather than
silently dropped. Every response names the revision that produced it in
``system_fingerprint`` (``sha256:<hex>``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .api import MAX_TOKENS

DEFAULT_MAX_TOKENS = 16
UNSUPPORTED = ("stop", "suffix", "logprobs", "logit_bias")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(Strict):
    include_usage: bool = False


class CompletionRequest(Strict):
    model: str | None = None  # absent: the served model
    prompt: str | list[str]
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)  # accepted; decoding is greedy
    top_p: float | None = Field(default=None, ge=0, le=1)        # accepted; decoding is greedy
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = None
    user: str | None = None
    n: Literal[1] | None = None
    best_of: Literal[1] | None = None
    echo: Literal[False] | None = None
    stop: None = None
    suffix: None = None
    logprobs: None = None
    logit_bias: None = None

    @field_validator(*UNSUPPORTED, mode="before")
    @classmethod
    def _unsupported(cls, value):
        if value not in (None, {}, [], ""):
            raise ValueError("is not supported by this server (greedy decoding, text only)")
        return None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[str]) -> str:
        if isinstance(value, list):
            if len(value) != 1:
                raise ValueError("give one prompt (a string, or a list of exactly one string)")
            value = value[0]
        if not value:
            raise ValueError("the prompt is empty")
        return value

    @property
    def tokens_asked(self) -> int:
        return self.max_tokens or DEFAULT_MAX_TOKENS


class Usage(BaseModel):
    prompt_tokens: int | None
    completion_tokens: int
    total_tokens: int | None


class Choice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class Completion(BaseModel):
    """A whole completion, or one server-sent chunk of a stream (``usage`` then on the
    last chunk only, when asked for)."""
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[Choice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "resident"
    revision: str | None  # the live revision's bundle digest; null while none is loaded


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


def usage(prompt_tokens: int | None, completion_tokens: int) -> Usage:
    total = None if prompt_tokens is None else prompt_tokens + completion_tokens
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=total)
