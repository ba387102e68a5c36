"""The inference port: an OpenAI-compatible completions API for applications.

``POST /v1/completions`` (``stream: true`` answers server-sent events ``data: {...}`` and
then ``data: [DONE]``), ``GET /v1/models`` and ``GET /v1/models/{id}``, and the probes
``/healthz``, ``/readyz``, ``/metrics``. Every answer a revision produced carries it: the
``Resident-Revision: sha256:<hex>`` header and ``system_fingerprint`` (on each chunk too).
A request holds the revision for its whole generation (:meth:`Owner.serving`), so one
revision answers it wholly. With an API key every route but the probes needs
``Authorization: Bearer <key>``; without one the port is open. Errors are OpenAI's error
object; the body is always read first, so a refusal never resets the connection.
"""

from __future__ import annotations

import itertools
import time
import uuid
from contextlib import closing

from pydantic import ValidationError

from . import openai_api as oa
from .backends.base import BackendError, stream
from .httpbase import PROBES, OwnerHandler, OwnerServer, Route, bind
from .runtime import Owner, Refused
from .server import bearer_matches

REVISION_HEADER = "Resident-Revision"


class ApiError(Refused):
    """A refusal with OpenAI's ``param`` and ``code``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(status, message)
        self.param, self.code = param, code


class InferenceHandler(OwnerHandler):
    model_name: str
    api_key: str | None
    started: int
    body = b""
    revision: str | None = None
    client_facing = True

    # -- plumbing ------------------------------------------------------------------
    def _error(self, code: int, message: str, retry_after: int | None = None) -> None:
        self._refuse(Refused(code, message, retry_after))

    def _refuse(self, e: Refused) -> None:
        code = e.status
        kind = "invalid_request_error" if code < 500 else "service_unavailable" if code == 503 else "server_error"
        body = oa.ErrorResponse(error=oa.ErrorBody(message=str(e), type=kind, param=getattr(e, "param", None),
                                                   code=getattr(e, "code", None)))
        headers = {"WWW-Authenticate": 'Bearer realm="resident-inference"'} if code == 401 else {}
        if e.retry_after:
            headers["Retry-After"] = str(e.retry_after)
        self.owner.metrics.errors.labels(revision=self.revision or "none", type=kind).inc()
        self._send(code, body.model_dump_json().encode(), headers=headers)

    def _admit(self, path: str) -> None:
        if path in PROBES:
            return
        if self.command == "POST":
            self.body = self._read_body()  # before any refusal: an unread body would reset the connection
        if self.api_key and not bearer_matches(self.headers.get("Authorization", ""), self.api_key):
            raise ApiError(401, "missing or wrong API key (Authorization: Bearer <key>)", None, "invalid_api_key")

    def _serve(self, routes: dict[str, Route]) -> None:
        self.body, self.revision, self._t0 = b"", None, time.perf_counter()
        try:
            self._dispatch(routes)
        finally:
            path = self.path.split("?", 1)[0]
            if path not in PROBES:
                revision = self.revision or "none"
                self.owner.metrics.requests.labels(revision=revision, code=str(self.code)).inc()
                self.owner.metrics.duration.observe(time.perf_counter() - self._t0)

    def _revision_headers(self) -> dict[str, str]:
        return {REVISION_HEADER: self.revision} if self.revision else {}

    def _json(self, model: oa.BaseModel) -> None:
        self._send(200, model.model_dump_json().encode(), headers=self._revision_headers())

    def _pattern_route(self, path: str) -> Route | None:
        if self.command == "GET" and path.startswith("/v1/models/"):
            return lambda: self._model(path.removeprefix("/v1/models/"))
        return None

    # -- routes --------------------------------------------------------------------
    def do_GET(self) -> None:
        self._serve({**self._probes(), "/v1/models": self._models})

    def do_POST(self) -> None:
        self._serve({"/v1/completions": self._completions})

    def _card(self) -> oa.ModelCard:
        self.revision = self.owner.live_digest()
        return oa.ModelCard(id=self.model_name, created=self.started, revision=self.revision)

    def _models(self) -> None:
        self._json(oa.ModelList(data=[self._card()]))

    def _model(self, name: str) -> None:
        if name != self.model_name:
            raise ApiError(404, f"the model {name!r} does not exist; this server serves {self.model_name!r}",
                           None, "model_not_found")
        self._json(self._card())

    def _request(self) -> oa.CompletionRequest:
        try:
            req = oa.CompletionRequest.model_validate_json(self.body)
        except ValidationError as e:
            first = e.errors()[0]
            param = str(first["loc"][0]) if first["loc"] else None
            where = ".".join(str(x) for x in first["loc"]) or "body"
            raise ApiError(400, f"{where}: {first['msg']}", param) from None
        if req.model not in (None, self.model_name):
            raise ApiError(404, f"the model {req.model!r} does not exist; this server serves "
                                f"{self.model_name!r}", "model", "model_not_found")
        return req

    def _completions(self) -> None:
        req = self._request()
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        with self.owner.serving() as revision:
            self.revision = revision
            pieces = stream(self.owner.backend, req.prompt, req.tokens_asked)
            with closing(pieces):
                try:
                    first = next(pieces, None)
                except BackendError as e:
                    raise ApiError(400, str(e), "prompt") from None
                self.owner.metrics.ttft.observe(time.perf_counter() - self._t0)
                head = oa.Completion(id=cid, created=created, model=self.model_name,
                                     system_fingerprint=self.revision, choices=[])
                everything = itertools.chain([first] if first is not None else [], pieces)
                if req.stream:
                    self._stream(req, head, everything)
                else:
                    self._whole(req, head, everything)

    def _whole(self, req: oa.CompletionRequest, head: oa.Completion, pieces) -> None:
        got = list(pieces)
        tokens = sum(len(p.tokens) for p in got)
        self.owner.metrics.tokens.labels(revision=self.revision).inc(tokens)
        head.choices = [oa.Choice(text="".join(p.text for p in got), finish_reason=_finish(req, tokens))]
        head.usage = oa.usage(got[0].prompt_tokens if got else None, tokens)
        self._json(head)

    def _stream(self, req: oa.CompletionRequest, head: oa.Completion, pieces) -> None:
        self.send_response(200)
        for name, value in {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                            "Transfer-Encoding": "chunked", **self._revision_headers()}.items():
            self.send_header(name, value)
        self.end_headers()
        tokens, prompt_tokens = 0, None
        try:
            for piece in pieces:
                tokens += len(piece.tokens)
                prompt_tokens = piece.prompt_tokens
                self.owner.metrics.tokens.labels(revision=self.revision).inc(len(piece.tokens))
                self._event(head.model_copy(update={"choices": [oa.Choice(text=piece.text, finish_reason=None)]}))
            self._event(head.model_copy(update={"choices": [oa.Choice(text="", finish_reason=_finish(req, tokens))]}))
            if req.stream_options and req.stream_options.include_usage:
                self._event(head.model_copy(update={"usage": oa.usage(prompt_tokens, tokens)}))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client left; the generation stops here
            return
        except Exception as e:  # noqa: BLE001 - the status is sent: report in the stream
            self.owner.metrics.errors.labels(revision=self.revision, type="stream_error").inc()
            self._event(oa.ErrorResponse(error=oa.ErrorBody(message=f"{type(e).__name__}: {e}",
                                                            type="server_error")))
        self._write(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def _event(self, doc: oa.BaseModel) -> None:
        self._write(b"data: " + doc.model_dump_json().encode() + b"\n\n")

    def _write(self, data: bytes) -> None:
        """One HTTP/1.1 chunk."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))


def _finish(req: oa.CompletionRequest, tokens: int) -> str:
    return "length" if tokens >= req.tokens_asked else "stop"


def make_inference_server(owner: Owner, host: str = "127.0.0.1", port: int = 8000, model_name: str = "model",
                          api_key: str | None = None) -> OwnerServer:
    """The inference port bound to ``host:port`` (port 0 picks a free one) serving ``owner``."""
    return bind(InferenceHandler, host, port, owner=owner, model_name=model_name, api_key=api_key,
                started=int(time.time()))
