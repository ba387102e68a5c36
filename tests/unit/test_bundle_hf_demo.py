"""The hf demo's shape rules (pure: no torch): sizes come out about right, heads split
evenly into grouped K/V, and a checkpoint is told apart from the numpy demo."""

import json

import pytest

from bundle.model_revisions import DemoError
from bundle.hf_demo import VOCAB, choose_hf_config, corpus, is_hf_checkpoint


@pytest.mark.parametrize("size", [256 * 1024, 1 << 20, 8 << 20, 64 << 20, 1 << 30])
def test_config_is_about_the_size_asked_with_grouped_heads(size):
    c = choose_hf_config(size, VOCAB)
    d, layers = c["hidden_size"], c["num_hidden_layers"]
    assert d == c["num_attention_heads"] * c["head_dim"]
    assert c["num_attention_heads"] % c["num_key_value_heads"] == 0
    assert c["num_key_value_heads"] < c["num_attention_heads"]
    params = 2 * VOCAB * d + layers * (3 * d * d + 3 * d * c["intermediate_size"])
    assert 0.8 < 2 * params / size < 1.2


def test_too_small_is_refused():
    with pytest.raises(DemoError, match="too small"):
        choose_hf_config(1000, VOCAB)


def test_the_corpus_is_deterministic_and_varied():
    assert corpus() == corpus() and len(set(corpus())) == len(corpus())


def test_checkpoints_are_told_apart_from_the_numpy_demo(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "resident-demo"}))
    assert not is_hf_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert is_hf_checkpoint(tmp_path)
    assert not is_hf_checkpoint(tmp_path / "absent")
