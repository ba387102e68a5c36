"""hf:// sources: a model repository of the Hugging Face Hub, at one commit, read as a bundle.

``hf://ORG/NAME@COMMIT`` names every file of the repository ``ORG/NAME`` as it is at the
git commit ``COMMIT`` (40 hex digits) on the Hub, or on any server that speaks the Hub's
HTTP API (``?endpoint=http(s)://host[:port]``). A commit never changes, so the files and
their bytes never change, and neither does the bundle made of them: the same URI always
gives the same manifest, whose digest a model pins in ``spec.bundle.digest`` as for any
other source. A branch or tag instead of a commit is refused with
:class:`RevisionNotPinned`, which says the commit the name points at now, so the user can
pin that.

**From repository to bundle.** The Hub holds files, not a Resident manifest, so the
manifest is *made*: the repository's tree at the commit is listed (path, size and, for
LFS files, the sha256 the Hub keeps as the LFS oid), and each file is read once and hashed
the way ``resident bundle build`` hashes a directory: whole-file sha256, per-chunk sha256
(chunks of ``chunk`` bytes at most, cut as ``chunking`` says: fixed slices by default, or
``chunking=tensors`` at a safetensors file's tensors, :mod:`bundle.chunking`), roles by
:data:`bundle.scan.DEFAULT_RULES`. So the bundle of ``hf://org/name@C`` is byte for byte
the bundle ``resident bundle build [--chunking tensors]`` makes of a download of
``org/name`` at ``C`` (without the files named by :data:`LEFT_OUT`, which describe the
repository, not the model). While hashing, every file is checked against
what the Hub says it is: an LFS file against its LFS oid, any other file against its git
blob id; a file that does not match is :class:`~bundle.errors.IntegrityMismatch`.

Making the manifest reads every byte once. A file whose LFS oid and size equal a file of a
manifest already at hand (``known=``, e.g. the donor revision, or any manifest made earlier
in this process) takes its chunk digests from there and is not read. A made manifest is
kept in the process (:data:`MADE`) for the same credentials, so the same commit is read
once per process and reader (another reader's manifest is never taken without asking the
server: the bridge's possession proof of a private repository reads the manifest). The
files that changed are read whole, though: the Hub keeps no digest finer than a file, so
a node that makes the manifest of a new commit reads each changed file once before it
fetches the chunks it lacks (docs/sources.md).

**Reading files.** File bytes are ranged GETs of the Hub's ``resolve`` URL at the commit
(``huggingface_hub.hf_hub_url``), resumed after a drop (:mod:`.ranged`), with the token as
a bearer header; a redirect to another host (the Hub's CDN) drops it, as ``requests`` does.
API requests (the tree, the refs) go through ``huggingface_hub``'s ``HfApi``.

**Credentials.** A private repository's token is the ``HF_TOKEN`` of the model's Secret
(:mod:`.credentials`). Nothing is taken from the environment or from huggingface_hub's
token file: without credentials, requests carry no token.

Errors, in our terms: a repository that does not exist, or is private and the token does
not open it, is :class:`RepositoryMissing`; a commit the repository does not hold (a
branch rewritten by a force-push) is :class:`CommitMissing`, naming where the branches
point now; a file the listing names but the server does not serve is
:class:`~bundle.errors.SourceUnavailable`; a token the Hub refuses (401 "Invalid
credentials", 403) is :class:`~bundle.errors.AccessDenied`; no answer, 5xx and 429 are
retried, then :class:`SourceUnavailable` (an outage).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import parse_qs, urlsplit

import requests

from ..chunking import FileHasher, check_chunking, cut_as
from ..errors import AccessDenied, IntegrityMismatch, SourceUnavailable
from ..manifest import (DEFAULT_CHUNK_SIZE, MANIFEST_NAME, FileEntry, Manifest, ManifestError,
                        build_entries, check_digest)
from ..scan import DEFAULT_RULES, role_for
from .credentials import HF_TOKEN, SourceCredentials
from .ranged import RangedReader, RetryPolicy, TransientUnavailable
from .source import Source, check_range, endpoint_option, query_options

DEFAULT_ENDPOINT = "https://huggingface.co"
OPTIONS = ("endpoint", "chunk", "chunking")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
# the Hub's repository names: letters, digits, '-', '_', '.'; no '--' or '..'; at most 96
NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
REF_RE = re.compile(r"^[A-Za-z0-9._/-]{1,255}$")
MIN_CHUNK, MAX_CHUNK = 64 * 1024, 64 * 1024 * 1024
LEFT_OUT = (".gitattributes", ".gitignore", "*.md")   # about the repository, not the model
MADE_KEEP = 32


class RevisionNotPinned(ManifestError):
    """The URI names a branch or tag, not a commit: the bundle would change when it moves."""


class RepositoryMissing(SourceUnavailable):
    """The server has no such repository, or it is private and the token does not open it."""


class CommitMissing(SourceUnavailable):
    """The repository does not hold the commit (it was never there, or a force-push dropped it)."""


@dataclass(frozen=True)
class HfLocation:
    """Where an hf:// URI points: a repository, a revision, the server, the chunk size."""

    repo_id: str       # "org/name"
    revision: str      # a commit (40 hex) once pinned; a ref name is kept to be explained
    endpoint: str      # "http(s)://host[:port]"
    chunk_size: int
    chunking: str = "fixed"   # how files are cut into chunks (bundle.chunking)

    @classmethod
    def parse(cls, uri: str) -> "HfLocation":
        usage = ("expected hf://org/name@<commit sha, 40 hex>[?endpoint=http(s)://host:port]"
                 "[&chunk=BYTES][&chunking=fixed|tensors]")
        try:
            parts = urlsplit(uri)
            query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        except ValueError as e:
            raise ManifestError(f"{uri!r}: not a valid hf:// URI ({e}); {usage}") from None
        if parts.scheme != "hf" or parts.fragment:
            raise ManifestError(f"{uri!r}: {usage}")
        # "org/name@rev": urlsplit puts "org" in netloc and "/name@rev" in the path
        whole = parts.netloc + parts.path
        repo_id, at, revision = whole.partition("@")
        names = repo_id.split("/")
        if len(names) != 2 or not all(NAME_RE.match(n) and "--" not in n and ".." not in n for n in names):
            raise ManifestError(f"{uri!r}: {repo_id!r} is not a repository name org/name; {usage}")
        if not at or not revision:
            raise ManifestError(f"{uri!r}: no revision; pin a commit: {usage}")
        if not COMMIT_RE.match(revision) and (not REF_RE.match(revision) or ".." in revision):
            raise ManifestError(f"{uri!r}: revision {revision!r} is neither a commit nor a branch name")
        opts = query_options(uri, query, OPTIONS, usage)
        endpoint = DEFAULT_ENDPOINT
        if "endpoint" in opts:
            endpoint = endpoint_option(uri, opts["endpoint"], "the token belongs in the model's Secret "
                                       "(spec.bundle.credentialsSecret, key HF_TOKEN)")
        chunk = opts.get("chunk", str(DEFAULT_CHUNK_SIZE))
        if not chunk.isdigit() or int(chunk) % 4096 or not MIN_CHUNK <= int(chunk) <= MAX_CHUNK:
            raise ManifestError(f"{uri!r}: chunk {chunk!r} must be a number of bytes, a multiple of "
                                f"4096 from {MIN_CHUNK} to {MAX_CHUNK}")
        try:
            chunking = check_chunking(opts.get("chunking", "fixed"))
        except ManifestError as e:
            raise ManifestError(f"{uri!r}: {e}") from None
        return cls(repo_id, revision, endpoint, int(chunk), chunking)

    @property
    def pinned(self) -> bool:
        return bool(COMMIT_RE.match(self.revision))

    def uri(self, revision: str | None = None) -> str:
        """The URI of this location (at ``revision``), parameters in a fixed order."""
        query = []
        if self.endpoint != DEFAULT_ENDPOINT:
            query.append(f"endpoint={self.endpoint}")
        if self.chunk_size != DEFAULT_CHUNK_SIZE:
            query.append(f"chunk={self.chunk_size}")
        if self.chunking != "fixed":
            query.append(f"chunking={self.chunking}")
        return f"hf://{self.repo_id}@{revision or self.revision}" + ("?" + "&".join(query) if query else "")

    @property
    def where(self) -> str:
        return f"{self.repo_id} at {self.endpoint}"



def left_out(path: str) -> bool:
    """Whether a repository file stays out of the bundle (:data:`LEFT_OUT`)."""
    from fnmatch import fnmatchcase
    name = path.rsplit("/", 1)[-1]
    return any(fnmatchcase(name, pattern) for pattern in LEFT_OUT)


def git_blob_id(data: bytes) -> str:
    """The git object id of a file's bytes (what the Hub lists for a file not in LFS)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class RepoFileInfo:
    """One file of the repository's tree at the commit, as the server lists it."""

    path: str
    size: int
    blob_id: str
    lfs_sha256: str | None


# manifests made in this process, by URI and reader (at most MADE_KEEP; the oldest goes first)
MADE: "OrderedDict[str, Manifest]" = OrderedDict()
_made_lock = threading.Lock()


class HfSource(Source):
    scheme = "hf"

    def __init__(self, uri: str, policy: RetryPolicy | None = None,
                 credentials: SourceCredentials | None = None,
                 known: Iterable[Manifest] = ()) -> None:
        super().__init__(uri)
        self.loc = HfLocation.parse(uri)
        self.policy = policy or RetryPolicy()
        token = (credentials or {}).get(HF_TOKEN) or None
        if credentials is not None and token is None:
            raise AccessDenied(f"AccessDenied: hf repository {self.loc.where}: the credentials "
                               f"lack {HF_TOKEN} (present: {', '.join(sorted(credentials)) or 'none'})")
        self._token = token
        # whose manifests these are: a manifest made with one token is not one another
        # reader may take without asking the server (a possession proof reads it)
        self._reader = credentials.fingerprint() if credentials is not None else "anonymous"
        self.session = requests.Session()
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        self.reader = HubReader(self.session, self.policy, self.scheme, self.loc)
        self.known = tuple(known)
        self._listing: list[RepoFileInfo] | None = None

    # -- the API ---------------------------------------------------------------------
    def _api(self, call: Callable[[Any], Any], what: str) -> Any:
        """One huggingface_hub call, retried while the server does not answer, errors ours."""
        from huggingface_hub import HfApi, constants
        from huggingface_hub.errors import HfHubHTTPError
        import httpx2

        if constants.is_offline_mode():   # read from the environment when huggingface_hub loaded
            raise SourceUnavailable(f"hf repository {self.loc.where}: cannot {what}: this process runs "
                                    "with HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set, which stops "
                                    "huggingface_hub's requests; unset it where hf:// sources are read")
        api = HfApi(endpoint=self.loc.endpoint, token=self._token or False)

        def attempt() -> Any:
            try:
                return call(api)
            except HfHubHTTPError as e:
                raise self.refusal(e, what) from None
            except (httpx2.TransportError, ConnectionError, TimeoutError) as e:
                raise TransientUnavailable(f"hf endpoint {self.loc.endpoint}: {what}: {e or type(e).__name__}") from e

        try:
            return self.policy.call(attempt, self.scheme)
        except TransientUnavailable as e:
            raise SourceUnavailable(str(e)) from e

    def refusal(self, e: Any, what: str) -> Exception:
        """The error for the server's answer ``e`` (an HfHubHTTPError) to ``what``."""
        response = getattr(e, "response", None)
        status = getattr(response, "status_code", 0) or 0
        headers = getattr(response, "headers", {}) or {}
        code, said = headers.get("X-Error-Code", ""), headers.get("X-Error-Message", "")
        return hub_refusal(self.loc, status, code, said, what)

    def listing(self) -> list[RepoFileInfo]:
        """Every file of the repository at the pinned commit (none left out), by path."""
        if self._listing is None:
            self._listing = self._list()
        return self._listing

    def bundle_bytes(self) -> int:
        """The size of the bundle the commit makes (what making its manifest may read)."""
        return sum(f.size for f in self.listing() if not left_out(f.path))

    def _list(self) -> list[RepoFileInfo]:
        commit = self.commit()

        def tree(api: Any) -> list[RepoFileInfo]:
            from huggingface_hub.hf_api import RepoFile
            return [RepoFileInfo(f.path, int(f.size), f.blob_id, f.lfs.sha256 if f.lfs else None)
                    for f in api.list_repo_tree(self.loc.repo_id, revision=commit, recursive=True)
                    if isinstance(f, RepoFile)]
        try:
            files = self._api(tree, f"list the files at commit {commit}")
        except (RepositoryMissing, CommitMissing) as e:
            raise self.explain_missing(commit) or e from None
        return sorted(files, key=lambda f: f.path)

    def branches(self) -> dict[str, str]:
        """Branch and tag names → the commit each points at now (one request)."""
        refs = self._api(lambda api: api.list_repo_refs(self.loc.repo_id), "list the branches")
        return {r.name: r.target_commit for r in [*refs.branches, *refs.tags]}

    def commit(self) -> str:
        """The pinned commit; a branch or tag is refused with the commit it points at now."""
        if self.loc.pinned:
            return self.loc.revision
        now = self.branches().get(self.loc.revision)
        if now is None:
            raise RevisionNotPinned(f"{self.uri!r}: {self.loc.revision!r} is not a commit, and "
                                    f"{self.loc.where} has no branch or tag of that name; pin a commit "
                                    "(40 hex digits)")
        raise RevisionNotPinned(f"{self.uri!r}: {self.loc.revision!r} is a branch or tag, not a commit; "
                                f"it points at {now} now. Pin that commit: {self.loc.uri(now)}")

    def explain_missing(self, commit: str) -> Exception | None:
        """After a 404 for the tree: is the repository missing, or only the commit?"""
        try:
            now = self.branches()
        except RepositoryMissing as e:
            return e
        except CommitMissing as e:   # no refs at all (a 404): the repository is not there
            return RepositoryMissing(f"hf repository {self.loc.where} does not exist, or is private "
                                     f"and the token does not open it ({e})")
        except SourceUnavailable:
            return None
        pointing = ", ".join(f"{name} → {sha}" for name, sha in sorted(now.items())) or "no branches"
        return CommitMissing(f"{self.uri!r}: {self.loc.where} has no commit {commit} (a branch "
                             f"rewritten by a force-push drops its old commits); its branches now: "
                             f"{pointing}")

    # -- the manifest ------------------------------------------------------------------
    def manifest(self, progress: Callable[[int], None] | None = None) -> Manifest:
        """The bundle of the repository at the commit (made once per process; see the module)."""
        key = f"{self.loc.uri(self.commit())} {self._reader}"
        with _made_lock:
            if key in MADE:
                MADE.move_to_end(key)
                return MADE[key]
        made = self.make_manifest(progress)
        with _made_lock:
            MADE[key] = made
            while len(MADE) > MADE_KEEP:
                MADE.popitem(last=False)
        return made

    def make_manifest(self, progress: Callable[[int], None] | None = None) -> Manifest:
        files = [f for f in self.listing() if not left_out(f.path)]
        if not files:
            raise ManifestError(f"{self.uri!r}: the repository holds no files at this commit")
        with _made_lock:
            known = [*self.known, *MADE.values()]
        by_content = {(e.sha256, e.size): e for m in known for e in m.files
                      if m.chunk_size == self.loc.chunk_size
                      and cut_as(e, m.chunk_size, self.loc.chunking)}
        entries = []
        for f in files:
            role = role_for(f.path, DEFAULT_RULES)
            seen = by_content.get((f.lfs_sha256, f.size)) if f.lfs_sha256 else None
            if seen is not None:
                entries.append(FileEntry(path=f.path, size=f.size, sha256=seen.sha256, role=role,
                                         chunks=seen.chunks, offsets=seen.offsets))
                if progress:
                    progress(f.size)
                continue
            sha, chunks, offsets = self.hash_file(f, progress)
            entries.append(FileEntry(path=f.path, size=f.size, sha256=sha, role=role, chunks=chunks,
                                     offsets=offsets))
        return build_entries(entries, self.loc.chunk_size)

    def hash_file(self, f: RepoFileInfo, progress: Callable[[int], None] | None
                  ) -> tuple[str, tuple[str, ...], tuple[int, ...]]:
        """Read a file once: its sha256, chunk digests and offsets, checked against the listing."""
        hasher = FileHasher(f.path, f.size, self.loc.chunk_size, self.loc.chunking)
        blob = hashlib.sha1(b"blob %d\0" % f.size)
        for block in self.reader.read(self.file_url(f.path), 0, f.size, f.path, f.lfs_sha256 or f.blob_id):
            hasher.update(block)
            if f.lfs_sha256 is None:
                blob.update(block)
            if progress:
                progress(len(block))
        sha, chunks, offsets = hasher.result()
        where = f"{self.loc.where}, commit {self.commit()}"
        if f.lfs_sha256 is not None and sha != f.lfs_sha256:
            raise IntegrityMismatch(f.path, f.lfs_sha256, sha,
                                    detail=f"served by {where}: not the file the Hub's LFS oid names")
        if f.lfs_sha256 is None and blob.hexdigest() != f.blob_id:
            raise IntegrityMismatch(f.path, f.blob_id, blob.hexdigest(),
                                    detail=f"served by {where}: git blob id, not the file the tree lists")
        return sha, chunks, offsets

    def manifest_bytes(self, digest: str) -> bytes:
        return self.manifest().canonical_json()

    def fetch_manifest(self, digest: str) -> Manifest:
        """The manifest of the commit, if its digest is ``digest``: another digest means the
        spec pins another bundle than this commit makes (another commit, another chunk)."""
        check_digest(digest)
        made = self.manifest()
        if made.digest != digest:
            raise IntegrityMismatch(MANIFEST_NAME, digest.removeprefix("sha256:"),
                                    made.digest.removeprefix("sha256:"),
                                    detail=f"{self.uri} makes bundle {made.digest}, not {digest}")
        return made

    # -- file bytes ----------------------------------------------------------------------
    def file_url(self, path: str) -> str:
        from huggingface_hub import hf_hub_url
        return hf_hub_url(self.loc.repo_id, path, revision=self.commit(), endpoint=self.loc.endpoint)

    def read(self, entry: FileEntry, offset: int, length: int) -> Iterator[bytes]:
        check_range(entry, offset, length)
        return self.reader.read(self.file_url(entry.path), offset, length, entry.path, entry.sha256)

    def close(self) -> None:
        self.session.close()


def hub_refusal(loc: HfLocation, status: int, code: str, said: str, what: str) -> Exception:
    """The error for a Hub answer (HTTP ``status``, ``X-Error-Code`` ``code``, ``X-Error-Message``
    ``said``) to the request ``what``, in our terms."""
    detail = f"HTTP {status}" + (f" {code}" if code else "") + (f": {said}" if said else "")
    if status == 401 and "invalid credentials" in said.lower():
        return AccessDenied(f"AccessDenied: hf repository {loc.where} refused the token ({detail}) "
                            f"to {what}; check HF_TOKEN in the model's Secret (spec.bundle.credentialsSecret)")
    if code == "GatedRepo" or status == 403:
        return AccessDenied(f"AccessDenied: hf repository {loc.where} refused access ({detail}) to "
                            f"{what}; the token (HF_TOKEN in spec.bundle.credentialsSecret) lacks read "
                            "access, or the repository is gated and its terms are not accepted")
    if code == "RepoNotFound" or status == 401:
        return RepositoryMissing(f"hf repository {loc.where} does not exist, or is private and the "
                                 f"token does not open it ({detail}); to {what}")
    if code == "RevisionNotFound":
        return CommitMissing(f"{loc.where} has no revision {loc.revision} ({detail})")
    if status in (404, 410):
        return CommitMissing(f"{loc.where}: not found ({detail}) to {what}")
    if status >= 500 or status == 429:
        return TransientUnavailable(f"hf repository {loc.where}: {detail} to {what}")
    return SourceUnavailable(f"hf repository {loc.where}: {detail} to {what}")


class HubReader(RangedReader):
    """Ranged reads of ``resolve`` URLs, the Hub's refusals put in our terms first."""

    def __init__(self, session: requests.Session, policy: RetryPolicy, scheme: str,
                 loc: HfLocation) -> None:
        super().__init__(session, policy, scheme)
        self.loc = loc

    def _start(self, resp: requests.Response, url: str, pos: int, end: int, offset: int,
               path: str, sha256: str) -> int:
        code = resp.headers.get("X-Error-Code", "")
        if resp.status_code in (401, 403) or code in ("RepoNotFound", "GatedRepo"):
            raise hub_refusal(self.loc, resp.status_code, code, resp.headers.get("X-Error-Message", ""),
                              f"read {path}")
        if resp.status_code in (404, 410):
            raise SourceUnavailable(f"{url}: the server does not serve {path} at this commit "
                                    f"(HTTP {resp.status_code}{' ' + code if code else ''})")
        return RangedReader._start(resp, url, pos, end, offset, path, sha256)

