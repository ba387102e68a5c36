"""hf:// URIs and the Hub's answers in our terms: pure, no server."""

from __future__ import annotations

import pytest

from bundle.errors import AccessDenied, SourceUnavailable
from bundle.manifest import DEFAULT_CHUNK_SIZE, ManifestError
from bundle.sources import HfSource, open_source, push, reads_credentials
from bundle.sources.hf import (DEFAULT_ENDPOINT, CommitMissing, HfLocation, RepositoryMissing,
                               git_blob_id, hub_refusal, left_out)
from bundle.sources.ranged import TransientUnavailable

SHA = "0123456789abcdef0123456789abcdef01234567"


def test_open_source_picks_hf_and_it_reads_credentials():
    assert isinstance(open_source(f"hf://org/name@{SHA}"), HfSource)
    assert reads_credentials(f"hf://org/name@{SHA}")


def test_an_hf_uri_names_repository_commit_server_and_chunk():
    loc = HfLocation.parse(f"hf://Org-1/my.model_v2@{SHA}?endpoint=http://127.0.0.1:8090/&chunk=65536")
    assert (loc.repo_id, loc.revision, loc.endpoint, loc.chunk_size, loc.pinned) == \
        ("Org-1/my.model_v2", SHA, "http://127.0.0.1:8090", 65536, True)
    assert loc.uri() == f"hf://Org-1/my.model_v2@{SHA}?endpoint=http://127.0.0.1:8090&chunk=65536"
    hub = HfLocation.parse(f"hf://org/name@{SHA}")
    assert (hub.endpoint, hub.chunk_size, hub.uri()) == (DEFAULT_ENDPOINT, DEFAULT_CHUNK_SIZE, f"hf://org/name@{SHA}")
    cut = HfLocation.parse(f"hf://org/name@{SHA}?chunking=tensors&chunk=65536")
    assert (cut.chunking, hub.chunking) == ("tensors", "fixed")
    assert cut.uri() == f"hf://org/name@{SHA}?chunk=65536&chunking=tensors"
    branch = HfLocation.parse("hf://org/name@main")      # parsed, to be explained by the source
    assert not branch.pinned and branch.uri(SHA) == f"hf://org/name@{SHA}"


@pytest.mark.parametrize("uri, why", [
    ("hf://org/name", "no revision; pin a commit"),
    ("hf://org/name@", "no revision"),
    ("hf://name@" + SHA, "is not a repository name org/name"),
    ("hf://a/b/c@" + SHA, "is not a repository name org/name"),
    ("hf://org/na--me@" + SHA, "is not a repository name"),
    ("hf://org/-name@" + SHA, "is not a repository name"),
    ("hf://org/name@a..b", "neither a commit nor a branch name"),
    ("hf://org/name@a b", "neither a commit nor a branch name"),
    (f"hf://org/name@{SHA}?endpoint=http://u:tok@h:1", "the token belongs in the model's Secret"),
    (f"hf://org/name@{SHA}?endpoint=ftp://h", "must be http(s)://host[:port]"),
    (f"hf://org/name@{SHA}?endpoint=http://h/mirror", "without a path"),
    (f"hf://org/name@{SHA}?chunk=1000", "a multiple of 4096"),
    (f"hf://org/name@{SHA}?chunk=4096", "from 65536"),
    (f"hf://org/name@{SHA}?chunk=64KiB", "must be a number of bytes"),
    (f"hf://org/name@{SHA}?revision=main", "unknown parameter revision"),
    (f"hf://org/name@{SHA}?chunking=rows", "chunking 'rows' must be one of fixed, tensors"),
    (f"hf://org/name@{SHA}?chunk=65536&chunk=65536", "given more than once"),
    (f"hf://org/name@{SHA}#x", "expected hf://org/name@"),
])
def test_malformed_hf_uris_are_refused_before_any_request(uri, why):
    with pytest.raises(ManifestError, match=why.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        open_source(uri)


def test_the_files_that_describe_the_repository_stay_out():
    assert left_out(".gitattributes") and left_out("README.md") and left_out("docs/USAGE.md")
    assert not left_out("config.json") and not left_out("model.safetensors") and not left_out("tokenizer.model")


def test_the_git_blob_id_is_gits():
    assert git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"        # git hash-object /dev/null
    assert git_blob_id(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_hf_is_read_only(tmp_path):
    with pytest.raises(ManifestError, match="hf:// is read only"):
        push(tmp_path, f"hf://org/name@{SHA}")


LOC = HfLocation.parse(f"hf://org/name@{SHA}")


@pytest.mark.parametrize("status, code, said, error, words", [
    (401, "", "Invalid credentials in Authorization header", AccessDenied, "refused the token"),
    (403, "GatedRepo", "", AccessDenied, "gated"),
    (403, "", "", AccessDenied, "lacks read access"),
    (401, "RepoNotFound", "Repository not found", RepositoryMissing, "does not exist, or is private"),
    (404, "RepoNotFound", "", RepositoryMissing, "does not exist"),
    (404, "RevisionNotFound", "", CommitMissing, f"has no revision {SHA}"),
    (404, "EntryNotFound", "", CommitMissing, "not found"),
    (503, "", "", TransientUnavailable, "HTTP 503"),
    (429, "", "", TransientUnavailable, "HTTP 429"),
    (400, "", "bad", SourceUnavailable, "HTTP 400: bad"),
])
def test_the_hubs_answers_become_our_errors(status, code, said, error, words):
    e = hub_refusal(LOC, status, code, said, "list the files")
    assert type(e) is error and words in str(e) and "org/name at https://huggingface.co" in str(e)


def test_a_process_in_huggingface_hub_offline_mode_says_so_before_any_request(monkeypatch):
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(SourceUnavailable, match="HF_HUB_OFFLINE"):
        HfSource(f"hf://org/name@{SHA}?endpoint=http://127.0.0.1:1").manifest()
