"""A leak-free validation carve for phrase-level files such as GLUE SST-2's training set.

GLUE's SST-2 ``train.tsv`` holds every labelled phrase of the Stanford Sentiment Treebank parse
trees, not just the sentences: a sentence and its sub-phrases are separate lines. A random carve
then puts sentences in validation whose sub-phrases (often the sentence itself) stay in training,
and validation accuracy is inflated. The rule here:

1. texts are compared as whitespace token sequences, so containment is on token boundaries
   ("bears" is inside "when are bears bears and", "bear" is not);
2. the **sentences** are the texts contained in no other distinct text of the file (the roots
   of the parse trees, plus any phrase whose sentence is missing from the file);
3. validation is a seeded random ``fraction`` of the sentences;
4. every text contained in a validation sentence (its phrases, and copies of the sentence
   itself) is dropped from training, so no validation sentence is seen in any form.

Containment is found by hashing the contiguous token spans of every distinct text whose lengths are
lengths of texts of the file, and looking them up in the set of texts (≈ 4 s for SST-2's 67K lines),
instead of comparing all pairs of texts. The number of lookups is counted before any is made and bounded
by :data:`MAX_SPAN_LOOKUPS` (one very long text among short ones costs only its length times the few
short lengths; many long texts of many lengths are refused with the limit named, not left to run for hours).
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass
from itertools import accumulate

__all__ = ["SentenceCarve", "carve_sentences", "contained_texts", "MAX_SPAN_LOOKUPS"]

#: The most token spans :func:`contained_texts` looks up (about a minute of CPU); more is refused.
MAX_SPAN_LOOKUPS = 100_000_000


def _spans(tokens: tuple[str, ...], sizes: list[int]):
    """Every contiguous span of ``tokens`` shorter than the whole whose length is in ``sizes`` (sorted)."""
    length = len(tokens)
    for size in sizes:
        if size >= length:
            break
        for start in range(length - size + 1):
            yield tokens[start:start + size]


def span_lookups(keys: set[tuple[str, ...]]) -> int:
    """How many spans :func:`contained_texts` looks up for ``keys``: Σ over keys of length L of
    Σ over the key lengths s < L of (L - s + 1). Computed from the lengths alone."""
    sizes = sorted({len(k) for k in keys})
    prefix = [0, *accumulate(sizes)]
    total = 0
    for key in keys:
        below = bisect.bisect_left(sizes, len(key))
        total += below * (len(key) + 1) - prefix[below]
    return total


def contained_texts(keys: set[tuple[str, ...]], limit: int = MAX_SPAN_LOOKUPS) -> set[tuple[str, ...]]:
    """The token sequences in ``keys`` that occur as a contiguous span of another (longer) key. ``ValueError``
    (naming the count, the longest text and ``limit``) before any work when more than ``limit`` spans would
    be looked up."""
    work = span_lookups(keys)
    if work > limit:
        longest = max(map(len, keys))
        raise ValueError(f"data.carve: sentences would look up {work:,} token spans of the training texts (the "
                         f"longest has {longest:,} tokens), more than the {limit:,} it allows; shorten the long "
                         f"texts, or use data.carve: random")
    sizes = sorted({len(k) for k in keys})
    found: set[tuple[str, ...]] = set()
    for key in keys:
        for span in _spans(key, sizes):
            if span in keys:
                found.add(span)
    return found


@dataclass
class SentenceCarve:
    """Result of :func:`carve_sentences`: indices into the input list, and the counts to report."""

    train: list[int]  # indices of the texts kept for training (corpus order)
    dev: list[int]  # indices of the validation sentences (corpus order; one per distinct sentence)
    texts: int  # input texts
    sentences: int  # distinct texts contained in no other text
    dropped: int  # texts removed from training because they occur inside a validation sentence

    def __str__(self) -> str:
        return (f"validation carve `sentences`: {self.texts} texts, {self.sentences} sentences (texts inside no "
                f"other text), {len(self.dev)} sentences held out as validation; {self.dropped} texts dropped "
                f"from training because they occur inside a validation sentence (token boundaries); "
                f"{len(self.train)} training texts left")


def carve_sentences(texts: list[str], fraction: float, seed: int) -> SentenceCarve:
    """Carve ``fraction`` of the sentences of ``texts`` as validation without leaking them into training.

    ``texts`` are compared as ``text.split()`` (apply lowercasing before calling if the model
    lowercases). The sentences are drawn with ``random.Random(seed)`` in corpus order, so the carve
    depends on the file and the seed only. Raises ``ValueError`` when ``fraction`` is not in
    (0, 1) or leaves no sentence for validation or none for training.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"the sentence carve needs a fraction in (0, 1), got {fraction}")
    keys = [tuple(text.split()) for text in texts]
    distinct = set(keys) - {()}
    inside = contained_texts(distinct)
    # One entry per distinct sentence, at its first occurrence, in corpus order.
    first: dict[tuple[str, ...], int] = {}
    for i, key in enumerate(keys):
        if key and key not in inside and key not in first:
            first[key] = i
    sentences = list(first)
    n_dev = max(1, round(len(sentences) * fraction))
    if n_dev >= len(sentences):
        raise ValueError(f"fraction {fraction} of {len(sentences)} sentences leaves none for training")
    order = list(range(len(sentences)))
    random.Random(seed).shuffle(order)
    dev_keys = [sentences[j] for j in sorted(order[:n_dev])]
    leaked: set[tuple[str, ...]] = set(dev_keys)
    sizes = sorted({len(k) for k in distinct})
    for key in dev_keys:
        leaked.update(span for span in _spans(key, sizes) if span in distinct)
    dev = [first[key] for key in dev_keys]
    dev_set = set(dev)
    train = [i for i, key in enumerate(keys) if key not in leaked]
    dropped = sum(1 for i, key in enumerate(keys) if key in leaked and i not in dev_set)
    return SentenceCarve(train=train, dev=dev, texts=len(texts), sentences=len(sentences), dropped=dropped)
