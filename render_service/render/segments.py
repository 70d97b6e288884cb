"""Token ids of a rendered prompt, reused segment by segment across turns.

Agent and chat clients re-send the whole history every turn, so a rendered prompt is mostly
text this worker has tokenized before. Hugging Face `tokenizers` matches the added vocabulary
(non-normalized added tokens) before anything else: the prompt is cut at every added token, and
normalizer, pre-tokenizer and model then run on each piece between two of them independently.
So the prompt's ids are the concatenation of each piece's ids and each added token's id, and a
piece seen before (the system prompt, the tool block, every earlier turn) costs a dict lookup.

That holds only where the tokenizer really works piece by piece. `build` checks it
at load and fails closed (`None`: encode whole, as before) where it does not hold:
added tokens that strip or require whitespace around them (`lstrip`, `rstrip`, `single_word`),
and, through a self-test that compares whole and segment-wise ids on text built around every
added token, anything else (a Metaspace pre-tokenizer that prepends only to the first piece, a
normalizer or post-step that looks across pieces, a backend quirk). `add_special_tokens=True`
(the post-processor's BOS/EOS) is always encoded whole.

The cache is per worker, an LRU bounded by entries and bytes, keyed by the piece's text itself
(Python's dict: its hash, then full equality, so a hit is never a collision).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

logger = logging.getLogger("render_service.render.segments")

Encode = Callable[[str, bool], list[int]]

# A piece above this share of the budget is encoded but not kept (one huge paste would evict the rest).
_LARGEST_SHARE = 8
# Python's cost per cached entry beyond the text: the OrderedDict slot, the tuple, and one int per id.
_ENTRY_OVERHEAD = 120
_BYTES_PER_ID = 36

# Text placed around added tokens by the self-test: whitespace runs (what lstrip/rstrip and
# Metaspace react to), partial and doubled markers, combining marks (NFC), bytes fallback, code.
_SELF_TEST_FRAGMENTS: tuple[str, ...] = (
    "",
    " ",
    "\n",
    "\n\n",
    "  \t",
    "Hello",
    " world ",
    "assistant\n",
    "x\n\n",
    "\u0301combining",
    "e\u0301",
    "<",
    ">",
    "<|",
    "|>",
    "<think",
    "</",
    "中文",
    "😀",
    "\x00\x7f",
    '{"a": [1, 2]}',
    "    return x\n",
    "\u00a0\u200b",
)


@dataclass(frozen=True)
class SegmentStats:
    """Counters since start (per worker), read by /metrics."""

    hits: int
    misses: int
    hit_tokens: int
    miss_tokens: int
    reused_prompts: int  # prompts that started with an earlier prompt of the conversation
    reused_tokens: int
    entries: int
    bytes: int
    max_bytes: int


class Segmenter:
    """Cuts text at the added tokens exactly where `tokenizers` does: leftmost match first, and the
    longest token among those starting there (its Aho-Corasick `LeftmostLongest`)."""

    def __init__(self, added: dict[str, int]) -> None:
        self.token_ids = dict(added)
        # With no added token inside another, a text cut right after an added token splits the same
        # way whatever follows; that is what lets a later prompt reuse an earlier one's ids up to there.
        self.nested = _any_nested(added)
        # A capturing group: re.split returns [piece, token, piece, token, ..., piece].
        tokens = [token for token in added if token]  # an empty token would cut everywhere
        self._pattern = re.compile("(" + _cut_pattern(tokens) + ")") if tokens else None

    def split(self, text: str) -> list[str]:
        if self._pattern is None:
            return [text]
        return self._pattern.split(text)


def alternation_pattern(tokens: Iterable[str]) -> str:
    """The added tokens as one alternation, longest first: the plain form of `trie_pattern` (the
    regex engine tries every token at each candidate position; kept as the reference it must match)."""
    return "|".join(map(re.escape, sorted(tokens, key=lambda text: (-len(text), text))))


def trie_pattern(tokens: Iterable[str]) -> str:
    """A regex matching exactly the tokens, leftmost-longest like `alternation_pattern`, written as
    their prefix tree: at each character one branch at most can continue, so a candidate position
    costs one walk down the tree, not one try per token (DeepSeek has 1,237 added tokens).

    A node that ends a token makes the rest optional (`(?:...)?`): greedy, so the longer token is
    tried first and the shorter one is the fallback, as the longest-first alternation has it."""
    root: dict[str, Any] = {}
    for token in tokens:
        if not token:
            continue
        node = root
        for char in token:
            node = node.setdefault(char, {})
        node[""] = {}  # the end of a token
    return _node_pattern(root)


def _cut_pattern(tokens: list[str]) -> str:
    """`trie_pattern`, or the alternation where the tree is too deep to write recursively (one
    level per branching character: a chain of tokens each one character longer than the last)."""
    try:
        return trie_pattern(tokens)
    except RecursionError:
        return alternation_pattern(tokens)


def _node_pattern(node: dict[str, Any]) -> str:
    ends = "" in node
    branches: list[str] = []
    for char, child in sorted(node.items()):
        if not char:
            continue
        run = [char]
        # A chain of single children that ends no token is written as one literal: the recursion
        # goes one level per branching point, not per character (a long added token is one level).
        while len(child) == 1 and "" not in child:
            ((char, child),) = child.items()
            run.append(char)
        branches.append(re.escape("".join(run)) + _node_pattern(child))
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
    if not ends:
        return body
    return ("(?:" + body + ")" if len(branches) == 1 else body) + "?"


def _any_nested(tokens: Iterable[str]) -> bool:
    known = set(tokens)
    for token in known:
        for start in range(len(token)):
            for end in range(start + 1, len(token) + 1):
                if (start, end) != (0, len(token)) and token[start:end] in known:
                    return True
    return False


@dataclass(frozen=True)
class Encoded:
    """A prompt's ids, and where its last added token ends (`head_chars` characters, `head_ids` ids):
    a later prompt that starts with those characters starts with those ids."""

    ids: list[int]
    head_chars: int
    head_ids: int
    reused_ids: int = 0  # ids copied from an earlier prompt
    # Where each added token ends (characters, ids), in order; the last is the head. None: not kept.
    marks: Marks | None = None


@dataclass(frozen=True)
class Marks:
    """The end of every added token of a prompt: `chars[k]` characters and `ids[k]` ids. A later
    prompt that starts with the first `chars[k]` characters starts with the first `ids[k]` ids."""

    chars: array[int]
    ids: array[int]

    @classmethod
    def empty(cls) -> Marks:
        return cls(array("q"), array("q"))

    def upto(self, count: int) -> Marks:
        """The first `count` marks (copies of two small arrays)."""
        return Marks(self.chars[:count], self.ids[:count])


class Reusable(Protocol):
    """An earlier prompt of the same conversation (see `prefix.PromptRecord`)."""

    head: str
    ids: list[int]
    head_ids: int
    marks: Marks | None


def shared_mark(text: str, previous: Reusable) -> int:
    """How many of `previous`'s marks `text` starts with (text up to the mark's end, byte for byte):
    the largest k with `text.startswith(previous.head[: marks.chars[k - 1]])`, by halving (the test
    holds for every shorter prefix when it holds for a longer one). 0: none, or no marks kept."""
    marks = previous.marks
    if marks is None or not marks.chars:
        return 0
    head, chars = previous.head, marks.chars
    low, high = 0, len(chars)
    if chars[-1] != len(head) or marks.ids[-1] != previous.head_ids or len(marks.ids) != high:
        return 0  # the last mark is the head; marks that say otherwise are not this prompt's
    while low < high:
        middle = (low + high + 1) // 2
        if text.startswith(head[: chars[middle - 1]]):
            low = middle
        else:
            high = middle - 1
    return low


class SegmentEncoder:
    """`encode(text, add_special_tokens)` with the same ids as the backend's whole-text encode."""

    def __init__(self, segmenter: Segmenter, encode: Encode, max_bytes: int, max_entries: int = 1 << 16) -> None:
        self.segmenter = segmenter
        self._encode = encode
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._bytes = 0
        self._largest = max_bytes // _LARGEST_SHARE
        # Workers render on the event loop, but the audit and tests may call from threads.
        self._lock = threading.Lock()
        self.hits = self.misses = self.hit_tokens = self.miss_tokens = 0
        self.reused_prompts = self.reused_tokens = 0

    @property
    def reuses_prefixes(self) -> bool:
        return not self.segmenter.nested

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if add_special_tokens:  # the post-processor's tokens depend on the whole sequence
            return self._encode(text, True)
        return self.encode_prompt(text).ids

    def encode_prompt(
        self, text: str, previous: Reusable | None = None, container: Callable[[list[int]], list[int]] = list
    ) -> Encoded:
        """`text`'s ids; when it starts with `previous.head` (an earlier prompt up to the end of its
        last added token), that prompt's first `previous.head_ids` ids are copied, not looked up;
        else when it starts with that prompt up to the end of an earlier added token (`shared_mark`),
        the ids up to there are.
        `container`: makes the list the ids are written into (from a list it copies), so a caller's
        own list type costs no second copy of ~30k ids."""
        offset = 0
        ids = None
        marks = Marks.empty()
        if previous is not None and previous.head and self.reuses_prefixes:
            if text.startswith(previous.head):
                offset, reused = len(previous.head), previous.head_ids
                if previous.marks is not None:
                    marks = previous.marks.upto(len(previous.marks.chars))
            else:
                # Another history (a template that drops earlier thinking at a new user message, an
                # edited message): the ids up to the last added token both prompts share are still
                # the previous prompt's.
                count = shared_mark(text, previous)
                offset = previous.marks.chars[count - 1] if count and previous.marks else 0
                reused = previous.marks.ids[count - 1] if count and previous.marks else 0
                if count and previous.marks is not None:
                    marks = previous.marks.upto(count)
            if reused and len(previous.ids) >= reused:
                ids = container(previous.ids)  # one copy of the whole list, then cut: cheaper than slicing first
                del ids[reused:]
            else:  # nothing shared, or the record kept no ids: encode it all
                offset, marks = 0, Marks.empty()
        reused = len(ids) if ids is not None else 0
        mark_chars, mark_ids = marks.chars, marks.ids
        parts = self.segmenter.split(text[offset:] if offset else text)
        token_ids = self.segmenter.token_ids
        # An unseen prompt's ids are written straight into the container (no copy of ~10k ids after);
        # after copied ids they go to a plain list first and into `ids` at once. Either way through
        # list's own C methods: a container's overrides (EncodedIds's drop the JSON text it does not
        # have yet) would run once a piece.
        added: list[int] = container([]) if ids is None and container is not list else []
        append, extend = list.append, list.extend
        head_chars, head_added = offset, 0
        with self._lock:
            for index, part in enumerate(parts):
                offset += len(part)
                if index & 1:
                    append(added, token_ids[part])
                    head_chars, head_added = offset, len(added)
                    mark_chars.append(offset)
                    mark_ids.append(reused + head_added)
                elif part:
                    extend(added, self._piece(part))
            if reused:
                self.reused_prompts += 1
                self.reused_tokens += reused
        if ids is None:
            ids = added
        else:
            ids.extend(added)
        return Encoded(ids, head_chars, reused + head_added, reused, marks)

    def _piece(self, piece: str) -> tuple[int, ...]:
        cache = self._cache
        cached = cache.get(piece)
        if cached is not None:
            cache.move_to_end(piece)
            self.hits += 1
            self.hit_tokens += len(cached)
            return cached
        ids = tuple(self._encode(piece, False))
        self.misses += 1
        self.miss_tokens += len(ids)
        size = _entry_bytes(piece, ids)
        if size <= self._largest:
            cache[piece] = ids
            self._bytes += size
            while self._bytes > self.max_bytes or len(cache) > self.max_entries:
                old, old_ids = cache.popitem(last=False)
                self._bytes -= _entry_bytes(old, old_ids)
        return ids

    def stats(self) -> SegmentStats:
        with self._lock:
            return SegmentStats(
                self.hits,
                self.misses,
                self.hit_tokens,
                self.miss_tokens,
                self.reused_prompts,
                self.reused_tokens,
                len(self._cache),
                self._bytes,
                self.max_bytes,
            )


def _entry_bytes(piece: str, ids: tuple[int, ...]) -> int:
    # The str's own size (1, 2 or 4 bytes a character) without walking it.
    return sys.getsizeof(piece) + _ENTRY_OVERHEAD + _BYTES_PER_ID * len(ids)


def segmenter_for(hf_tokenizer: Any) -> tuple[Segmenter | None, str | None]:
    """The added tokens to cut at, or (None, why) when an added token depends on its neighbours."""
    backend = getattr(hf_tokenizer, "_tokenizer", hf_tokenizer)
    try:
        decoder = backend.get_added_tokens_decoder()
    except AttributeError:
        return None, "not a Hugging Face `tokenizers` tokenizer"
    if getattr(getattr(backend, "model", None), "dropout", None):
        return None, "BPE dropout: the same text can encode differently"
    added: dict[str, int] = {}
    for token_id, token in decoder.items():
        content = token.content
        if not content:
            continue
        if token.lstrip or token.rstrip or token.single_word:
            return None, f"added token {content!r} strips or requires whitespace around it (lstrip/rstrip/single_word)"
        # A normalized added token is matched inside each piece, after normalization: encoding the
        # piece whole handles it, so only the non-normalized ones are cut points.
        if not token.normalized:
            added[content] = token_id
    return Segmenter(added), None


def self_test_texts(tokens: Iterable[str], extra_texts: Sequence[str] = ()) -> list[str]:
    """Text around every added token (and pairs of them), then `extra_texts` (e.g. a rendered prompt)."""
    tokens = list(tokens)
    fragments = _SELF_TEST_FRAGMENTS
    texts = [*extra_texts]
    for i, token in enumerate(tokens):
        for j, before in enumerate(fragments):
            after = fragments[(i + 3 * j + 1) % len(fragments)]
            texts.append(before + token + after)
        other = tokens[(i + 1) % len(tokens)]
        texts.append(token + token + other + " x" + other + "\n" + token)
        texts.append(fragments[i % len(fragments)] + token + "\n\n" + other + fragments[(i + 5) % len(fragments)])
    return texts


def self_test(segmenter: Segmenter, encode: Encode, extra_texts: Sequence[str] = ()) -> str | None:
    """None if segment-wise ids equal whole-text ids on every test text, else the first text that differs."""
    probe = SegmentEncoder(segmenter, encode, max_bytes=1 << 20)
    for text in self_test_texts(segmenter.token_ids, extra_texts):
        if probe.encode(text) != encode(text, False):
            return text[:80]
    return None


def build(
    hf_tokenizer: Any, encode: Encode, max_bytes: int, extra_texts: Sequence[str] = ()
) -> tuple[SegmentEncoder | None, Segmenter | None, str | None]:
    """(the cache or None, the segmenter when segment-wise ids are proven equal, why not)."""
    segmenter, reason = segmenter_for(hf_tokenizer)
    if segmenter is None:
        return None, None, reason
    mismatch = self_test(segmenter, encode, extra_texts)
    if mismatch is not None:
        return None, None, f"whole and segment-wise ids differ on {mismatch!r}"
    if max_bytes <= 0:
        return None, segmenter, "disabled (--segment-cache-bytes 0)"
    # Half the budget for pieces; the prefix guard keeps recent prompts' ids in the other half.
    return SegmentEncoder(segmenter, encode, max_bytes // 2), segmenter, None


def head_of(segmenter: Segmenter, text: str, ids: list[int], encode: Encode) -> tuple[int, int]:
    """(characters, ids) of `text` up to the end of its last added token, for a prompt encoded whole."""
    parts = segmenter.split(text)
    if len(parts) == 1:
        return 0, 0
    last = parts[-1]
    return len(text) - len(last), len(ids) - (len(encode(last, False)) if last else 0)
