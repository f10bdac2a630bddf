"""Build a small local word-level tokenizer for SGLang's ``bench_serving`` (no Hugging Face access).

    python benchmarks/loadgen_tokenizer.py /tmp/loopback-tokenizer

``bench_serving --dataset-name random-ids`` only needs a tokenizer to know the vocabulary size and
to decode random ids into a prompt; the loopback server ignores prompt content. Run it with the
bench_serving venv's Python (it needs ``tokenizers`` and ``transformers``).
"""

from __future__ import annotations

import sys
from pathlib import Path


def build(out: Path, vocab_size: int = 32000) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(len(vocab), vocab_size):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))


if __name__ == "__main__":
    build(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/loopback-tokenizer"))
    print("saved")
