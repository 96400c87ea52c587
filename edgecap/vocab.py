"""Caption tokenisation and the word vocabulary saved with every model (torch-free)."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")

_NON_WORD = re.compile(r"[^a-z0-9 ]+")
ENDING_SHARE = 0.01  # a word that ends fewer than this share of the training captions it is in may not end one


def tokenize(text: str) -> list[str]:
    """Lower-case, strip punctuation, split on whitespace: the one tokeniser for training and scoring."""
    return _NON_WORD.sub(" ", text.lower().replace("'", "")).split()


@dataclass(frozen=True)
class Vocab:
    """Id <-> word table; ids 0-3 are ``<pad> <bos> <eos> <unk>``."""

    words: tuple[str, ...]
    learned_endings: tuple[str, ...] = ()  # words that (almost) never end a training caption: bad endings

    @classmethod
    def build(cls, captions: Iterable[str], *, min_count: int = 5) -> Vocab:
        """Words seen at least ``min_count`` times in ``captions``, most frequent first, with the words that end
        fewer than ``ENDING_SHARE`` of the captions they are in (``learned_endings``)."""
        tokenized = [tokenize(caption) for caption in captions]
        counts = Counter(word for words in tokenized for word in words)
        endings = Counter(words[-1] for words in tokenized if words)
        kept = sorted((w for w, n in counts.items() if n >= min_count), key=lambda w: (-counts[w], w))
        return cls(SPECIALS + tuple(kept), tuple(w for w in kept if endings[w] < ENDING_SHARE * counts[w]))

    def __len__(self) -> int:
        return len(self.words)

    @cached_property
    def index(self) -> dict[str, int]:
        return {w: i for i, w in enumerate(self.words)}

    def encode(self, caption: str, *, max_length: int) -> list[int]:
        """Word ids of a caption, truncated to ``max_length`` words, without bos/eos."""
        index = self.index
        return [index.get(w, UNK) for w in tokenize(caption)[:max_length]]

    def decode(self, ids: Sequence[int]) -> str:
        """Caption text of ids, stopping at the first eos and skipping other specials."""
        out = []
        for i in ids:
            i = int(i)
            if i == EOS:
                break
            if i >= len(SPECIALS):
                out.append(self.words[i])
        return " ".join(out)

    def to_json(self) -> dict:
        learned = {"learned_endings": list(self.learned_endings)} if self.learned_endings else {}
        return {"words": list(self.words), "pad": PAD, "bos": BOS, "eos": EOS, "unk": UNK, **learned}

    @classmethod
    def from_json(cls, data: dict) -> Vocab:
        words = tuple(data["words"])
        if words[: len(SPECIALS)] != SPECIALS:
            raise ValueError(f"vocabulary must start with {SPECIALS}, got {words[:4]}")
        return cls(words, tuple(data.get("learned_endings", ())))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json()))
