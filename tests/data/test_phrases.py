"""The leak-free sentence carve (``hyperplex.data.phrases``) on a hand-made SST-2-like phrase file
whose sentences, held-out phrases and counts are known."""

import pytest

from hyperplex.data.phrases import carve_sentences, contained_texts

# Two parse trees' worth of phrases plus one sentence without phrases, a duplicate line, and
# "bears" (a word inside sentence 0) vs "bear" (inside no other text on token boundaries).
TEXTS = [
    "when are bears bears and",  # 0  sentence A
    "bears bears",  # 1  phrase of A
    "bears",  # 2  phrase of A
    "a fine film",  # 3  sentence B
    "fine film",  # 4  phrase of B
    "film",  # 5  phrase of B (and of nothing else)
    "bear",  # 6  a sentence: "bear" is inside "bears" as characters, not as a token
    "it is dull",  # 7  sentence C
    "when are bears bears and",  # 8  duplicate of A
    "is dull",  # 9  phrase of C
]
SENTENCES = {0, 3, 6, 7}


def test_contained_texts_on_token_boundaries():
    keys = {tuple(t.split()) for t in TEXTS}
    inside = contained_texts(keys)
    assert {" ".join(k) for k in inside} == {"bears bears", "bears", "fine film", "film", "is dull"}
    assert ("bear",) not in inside  # a character substring of "bears" is not a token span


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_carve_holds_out_sentences_and_drops_their_phrases(seed):
    carve = carve_sentences(TEXTS, 0.25, seed)  # 25% of 4 sentences = 1
    assert (carve.texts, carve.sentences) == (10, 4)
    assert len(carve.dev) == 1 and carve.dev[0] in SENTENCES
    held = TEXTS[carve.dev[0]].split()
    # nothing left in training lies inside the held-out sentence (token spans), and the rest is kept
    for i in carve.train:
        words = TEXTS[i].split()
        assert not any(held[j:j + len(words)] == words for j in range(len(held)))
    phrases_of = {0: {1, 2, 8}, 3: {4, 5}, 6: set(), 7: {9}}  # lines dropped with each sentence
    expected_train = [i for i in range(10) if i != carve.dev[0] and i not in phrases_of[carve.dev[0]]]
    assert carve.train == expected_train
    assert carve.dropped == len(phrases_of[carve.dev[0]])
    assert str(carve.dropped) in str(carve) and "4 sentences" in str(carve)


def test_every_sentence_is_held_out_by_some_seed_and_seed_fixes_it():
    held = {carve_sentences(TEXTS, 0.25, seed).dev[0] for seed in range(40)}
    assert held == SENTENCES
    assert carve_sentences(TEXTS, 0.25, 7) == carve_sentences(TEXTS, 0.25, 7)


def test_two_sentences_out_drop_both_phrase_sets():
    carve = carve_sentences(TEXTS, 0.5, 3)
    assert len(carve.dev) == 2 and set(carve.dev) <= SENTENCES
    assert len(carve.train) + len(carve.dev) + carve.dropped == len(TEXTS)


@pytest.mark.parametrize("fraction", [0.0, 1.0, 0.9])
def test_bad_fraction(fraction):
    with pytest.raises(ValueError, match="fraction"):
        carve_sentences(TEXTS, fraction, 1)


def _contained_by_all_spans(keys):
    """The definition, by brute force over every span of every key."""
    return {k for k in keys for other in keys if len(other) > len(k)
            and any(other[i:i + len(k)] == k for i in range(len(other) - len(k) + 1))}


def test_only_lengths_of_texts_are_looked_up_and_the_result_is_the_definitions():
    import random

    from hyperplex.data.phrases import span_lookups

    rng = random.Random(0)
    keys = {tuple(rng.choice("abc") for _ in range(rng.randint(1, 9))) for _ in range(200)}
    assert contained_texts(keys) == _contained_by_all_spans(keys)
    assert span_lookups({("a",) * 5, ("a", "b")}) == 4  # only the spans of length 2 of the longer key
    long_text = tuple(f"w{i % 50}" for i in range(800_000))  # one 800k-token text among short ones: linear
    keys = {long_text, ("w3", "w4"), ("w4", "w9"), ("x",)}
    assert span_lookups(keys) < 3 * 800_000
    assert contained_texts(keys) == {("w3", "w4")}


def test_a_carve_that_would_run_for_hours_is_refused_naming_the_option():
    texts = [" ".join(f"t{j}" for j in range(length)) for length in range(1, 3001)]  # ~4.5e9 lookups
    with pytest.raises(ValueError, match=r"data.carve: sentences would look up 4,5\d\d,\d{3},\d{3} token spans .*"
                                         r"the longest has 3,000 tokens\), more than the 100,000,000 it allows"):
        carve_sentences(texts, 0.1, 0)
