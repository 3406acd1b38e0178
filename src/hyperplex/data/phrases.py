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

Containment is found by hashing every contiguous token span of every distinct text and looking
it up in the set of texts: Σ L²/2 lookups for texts of L tokens (≈ 4 s for SST-2's 67K lines),
instead of comparing all pairs of texts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["SentenceCarve", "carve_sentences", "contained_texts"]


def _spans(tokens: tuple[str, ...]):
    """Every contiguous span of ``tokens`` shorter than the whole (as tuples)."""
    length = len(tokens)
    for size in range(1, length):
        for start in range(length - size + 1):
            yield tokens[start:start + size]


def contained_texts(keys: set[tuple[str, ...]]) -> set[tuple[str, ...]]:
    """The token sequences in ``keys`` that occur as a contiguous span of another (longer) key."""
    found: set[tuple[str, ...]] = set()
    for key in keys:
        for span in _spans(key):
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
    for key in dev_keys:
        leaked.update(span for span in _spans(key) if span in distinct)
    dev = [first[key] for key in dev_keys]
    dev_set = set(dev)
    train = [i for i, key in enumerate(keys) if key not in leaked]
    dropped = sum(1 for i, key in enumerate(keys) if key in leaked and i not in dev_set)
    return SentenceCarve(train=train, dev=dev, texts=len(texts), sentences=len(sentences), dropped=dropped)
