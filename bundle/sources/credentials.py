"""Source credentials: the data of the Secret a model names, handed to the source it reads.

A ResidentModel whose bundle lives in a private place names a Secret in its own namespace
(``spec.bundle.credentialsSecret``). Its data reaches each reader of the source the
Kubernetes way, never from an identity or environment shared by every tenant:

- the bridge receives it from kubelet as the ``secrets`` of NodePublishVolume (the owner
  Pod's inline volume carries ``nodePublishSecretRef``) and keeps it in memory only;
- the operator reads the Secret itself, to check that the source holds the revision;
- the ``resident`` CLI, run by a person, takes it from that person's environment
  (:func:`from_environment`).

Each scheme takes the keys it knows and ignores the rest (:data:`S3_KEYS` for s3://,
:data:`HF_KEYS` for hf://).
Values are never logged, printed or written to disk: the ``repr`` names the keys only.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping

S3_ACCESS_KEY = "AWS_ACCESS_KEY_ID"
S3_SECRET_KEY = "AWS_SECRET_ACCESS_KEY"
S3_SESSION_TOKEN = "AWS_SESSION_TOKEN"
S3_KEYS = (S3_ACCESS_KEY, S3_SECRET_KEY, S3_SESSION_TOKEN)
HF_TOKEN = "HF_TOKEN"   # hf://: a Hugging Face access token with read access to the repository
HF_KEYS = (HF_TOKEN,)
SCHEME_KEYS = {"s3": S3_KEYS, "hf": HF_KEYS}   # what each scheme that reads credentials takes


class SourceCredentials(Mapping[str, str]):
    """An immutable mapping of credential names to values (a Secret's decoded data)."""

    def __init__(self, data: Mapping[str, str]) -> None:
        self._data = {str(k): str(v) for k, v in data.items()}

    def __getitem__(self, key: str) -> str:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:   # never the values
        return f"SourceCredentials(keys={sorted(self._data)})"

    __str__ = __repr__

    def fingerprint(self) -> str:
        """A digest that tells two sets of credentials apart (a cache key; not a secret,
        not reversible, never shown)."""
        h = hashlib.sha256()
        for k in sorted(self._data):
            h.update(k.encode() + b"\0" + self._data[k].encode() + b"\0")
        return h.hexdigest()


def from_environment(keys: tuple[str, ...] = S3_KEYS) -> SourceCredentials | None:
    """The credentials of the person running the CLI: ``keys`` found in the environment,
    or None if none is set."""
    found = {k: os.environ[k] for k in keys if os.environ.get(k)}
    return SourceCredentials(found) if found else None
