"""hyperplex.inference.verbs on a tiny trained translator: what ``evaluate`` and ``translate`` return equals
the task's own validation and decoding of the loaded model, which equals greedy search run directly.
(The CLI verbs that print these are tested in tests/cli/test_main.py; loading in tests/inference/test_load.py.)"""

import pytest
import torch

from hyperplex.inference import verbs as inference
from hyperplex.inference.load import load_model
from hyperplex.train.run import train


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from conftest import write_tiny_config

    tmp = tmp_path_factory.mktemp("inference")
    train(str(write_tiny_config(tmp, max_steps=24, validation_every=8)), model_dir=str(tmp / "model"))
    return tmp / "model"


def test_evaluate_returns_the_validation_of_the_loaded_model_with_its_signatures(model_dir):
    metrics = inference.evaluate(str(model_dir), beam_size=2)
    _, task, model = load_model(model_dir)  # the same model scored directly, same beam
    expected = task.validate(model, beam_size=2)
    assert metrics == expected | {f"{name}_signature": sig for name, sig in task.signatures.items()}


def test_translate_writes_the_tasks_decoding_one_line_per_line(model_dir, tmp_path):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("x=1,y=2,x+y\n\ny=-5,x=3,y*x\n")
    assert inference.translate(str(model_dir), str(src), str(out)) == 3
    _, task, model = load_model(model_dir, read_data=False)  # the same model, the config's decoding
    assert out.read_text().splitlines() == task.translate(model, src.read_text().splitlines())


def test_translate_matches_search_directly(model_dir):
    cfg, task, model = load_model(model_dir, read_data=False)
    from hyperplex.models.search import greedy_search

    line = "x=7,y=1,x-y"
    ids = task.src_vocab.encode(task.src_tok.tokenize(line), add_eos=True)
    hyp = greedy_search(model, torch.tensor([ids]), torch.tensor([len(ids)]), cfg.testing.max_output_length)[0][0]
    expected = task.tgt_tok.detokenize(task.tgt_vocab.decode(hyp.tokens))
    assert task.translate(model, [line], beam_size=1) == [expected]


def test_translate_as_a_library_call_refuses_to_write_over_its_model_or_its_input(model_dir, tmp_path):
    from hyperplex.guards import OutputError

    source = tmp_path / "in.txt"
    source.write_text("12+3\n")
    kept = {p.name: p.read_bytes() for p in model_dir.iterdir() if p.is_file()}
    for target in (model_dir / "best.safetensors", model_dir / "config.yaml", source):
        with pytest.raises(OutputError, match="output_path"):
            inference.translate(str(model_dir), str(source), str(target))
    assert {p.name: p.read_bytes() for p in model_dir.iterdir() if p.is_file()} == kept
    assert source.read_text() == "12+3\n"
