"""The cpu model format's tokenizer: the demo's words, and the bytes of older bundles."""

import json

import pytest

from bundle.cpu_model import VOCAB, WORDS, Tokenizer

pytestmark = pytest.mark.unit

WORDS_JSON = json.dumps({"type": "words", "words": list(WORDS)}).encode()


def test_the_demo_vocabulary_is_one_distinct_word_per_token():
    assert len(WORDS) == len(set(WORDS)) == VOCAB
    assert all(w.isalpha() and w.islower() for w in WORDS)


def test_words_encode_to_their_index_and_print_as_words():
    tok = Tokenizer.from_json(WORDS_JSON)
    ids = tok.encode("The river, under the Moon.")
    assert ids[:2] == [WORDS.index("the"), WORDS.index("river")]
    assert len(ids) == 7   # five words, a comma and a full stop
    assert tok.decode([WORDS.index("quiet"), WORDS.index("harbor")]) == " quiet harbor"


def test_unknown_words_encode_stably_into_the_vocabulary():
    tok = Tokenizer.from_json(WORDS_JSON)
    a, b = tok.encode("zyzzyva 42 ünïcode"), tok.encode("zyzzyva 42 ünïcode")
    assert a == b and len(a) == 3 and all(0 <= t < VOCAB for t in a)
    assert tok.encode("") == []


def test_pieces_join_to_the_decoded_text_for_words_and_bytes():
    words = Tokenizer.from_json(WORDS_JSON)
    tokens = [3, 200, 17]
    assert "".join(t for _, t in words.pieces(tokens)) == words.decode(tokens) == \
        f" {WORDS[3]} {WORDS[200]} {WORDS[17]}"
    raw = Tokenizer.from_json(b'{"type": "bytes", "vocab_size": 256}')
    utf8 = list("é!".encode())                     # a two-byte character, then one byte
    pieces = list(raw.pieces(utf8))
    assert [t for _, t in pieces] == ["", "é", "!"] and raw.decode(utf8) == "é!"
    assert list(raw.pieces([0xC3])) == [(0xC3, ""), (None, "\ufffd")]   # a dangling tail comes last
    assert Tokenizer.from_json(None).encode("ab") == [97, 98]


@pytest.mark.parametrize("raw, says", [
    (b"{", "not JSON"),
    (b'{"type": "sentencepiece"}', "unknown type 'sentencepiece'"),
    (b'{"type": "words", "words": []}', "distinct non-empty"),
    (b'{"type": "words", "words": ["a", "a"]}', "distinct non-empty"),
    (json.dumps({"type": "words", "words": [f"w{i}" for i in range(VOCAB + 1)]}).encode(), "distinct"),
])
def test_a_malformed_tokenizer_says_what_is_wrong(raw, says):
    with pytest.raises(ValueError, match=says):
        Tokenizer.from_json(raw)
