from edgecap.vocab import BOS, EOS, PAD, SPECIALS, UNK, Vocab, tokenize


def test_tokenize_lowercases_and_strips_punctuation():
    assert tokenize("A black dog's ball, in the snow .") == ["a", "black", "dogs", "ball", "in", "the", "snow"]


def test_build_keeps_frequent_words_and_specials_first():
    vocab = Vocab.build(["a dog runs", "a dog sits", "a cat"], min_count=2)
    assert vocab.words[:4] == SPECIALS and (PAD, BOS, EOS, UNK) == (0, 1, 2, 3)
    assert vocab.words[4:] == ("a", "dog")
    assert vocab.encode("A cat dog", max_length=10) == [4, UNK, 5]
    assert vocab.encode("a a a a", max_length=2) == [4, 4]


def test_decode_stops_at_eos_and_skips_specials():
    vocab = Vocab.build(["a dog runs"], min_count=1)
    ids = [BOS, *vocab.encode("a dog runs", max_length=5), EOS, 4, PAD]
    assert vocab.decode(ids) == "a dog runs"


def test_json_round_trip(tmp_path):
    vocab = Vocab.build(["a dog runs"], min_count=1)
    vocab.save(tmp_path / "v.json")
    import json

    assert Vocab.from_json(json.loads((tmp_path / "v.json").read_text())) == vocab
