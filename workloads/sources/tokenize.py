"""Text to token ids for datasets of text (ShareGPT), without the internet.

A model folder parasweep ships holds a ``config.json`` and no tokenizer. Where a ``tokenizer.json`` sits
beside it (a GPU node with the real weights) and the ``tokenizers`` package is installed (SGLang brings
it), that is the tokenizer: exact. Otherwise a vocabulary the ``quicktok-v1`` package bundles stands in:
exact for the Llama 3 and Qwen 2.5/3 families, an approximation for every other model (lengths within a
few per cent on English text; docs/workloads.md has the numbers). The run names the tokenizer it used.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np

# model family (a prefix of config.json's model_type) -> the bundled encoding that is its own
EXACT_ENCODINGS = {"llama": "llama3", "qwen2": "qwen3", "qwen3": "qwen3"}
# for every other model: a stand-in of about the same vocabulary size
STAND_IN = "cl100k_base"
ENCODINGS = ("llama3", "qwen3", "cl100k_base", "o200k_base")


def pick(model_dir: str | Path, model_type: str, vocab_size: int) -> tuple[str, str]:
    """(tokenizer name, one line saying what it is) for a model folder.

    ``tokenizer.json`` in the folder wins; else the bundled encoding of the model's family where its
    vocabulary size matches (Llama 2's 32,000-token vocabulary is not Llama 3's); else the stand-in."""
    own = Path(model_dir) / "tokenizer.json"
    if own.is_file():
        return str(own), f"the model's own tokenizer ({own})"
    for family, enc in EXACT_ENCODINGS.items():
        if model_type.startswith(family) and vocab_size >= _vocab_floor(enc):
            return f"quicktok:{enc}", f"quicktok {enc}: the {family} family's own vocabulary"
    return (f"quicktok:{STAND_IN}",
            f"quicktok {STAND_IN}, standing in for {model_type}'s own tokenizer (not shipped): prompt "
            "lengths are approximate")


def _vocab_floor(encoding: str) -> int:
    # the smallest model vocabulary the encoding's ids fit: Llama 3's 128,000 BPE ranks, Qwen's 151,643
    return {"llama3": 128_000, "qwen3": 151_643}[encoding]


class Tokenizer:
    """Encodes texts in a batch: (all ids, start offsets)."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name.startswith("quicktok:"):
            import quicktok

            encoding = name.split(":", 1)[1]
            if encoding not in ENCODINGS:
                raise ValueError(f"workload.tokenizer: unknown quicktok encoding {encoding!r} "
                                 f"(one of {', '.join(ENCODINGS)})")
            self._quick = quicktok.get_encoding(encoding)
            self._hf = None
        else:
            path = Path(name)
            if not path.is_file():
                raise ValueError(f"workload.tokenizer: {name} is not a tokenizer.json file (or give "
                                 f"quicktok:<{'|'.join(ENCODINGS)}>)")
            try:
                from tokenizers import Tokenizer as HfTokenizer
            except ImportError:
                raise ValueError(f"workload.tokenizer: reading {name} needs the 'tokenizers' package "
                                 "(installed with SGLang)") from None
            self._hf = HfTokenizer.from_file(str(path))
            self._quick = None

    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Every text's ids concatenated (uint32) and the offsets where each starts (len + 1)."""
        if self._quick is not None:
            ids, offsets = self._quick.encode_batch(list(texts), 0, False)
            return np.asarray(ids, dtype=np.uint32), np.asarray(offsets, dtype=np.int64)
        assert self._hf is not None
        encoded = [e.ids for e in self._hf.encode_batch(list(texts), add_special_tokens=False)]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(e) for e in encoded])
        flat = np.fromiter((t for e in encoded for t in e), dtype=np.uint32, count=int(offsets[-1]))
        return flat, offsets


@functools.lru_cache(maxsize=4)
def tokenizer(name: str) -> Tokenizer:
    return Tokenizer(name)
