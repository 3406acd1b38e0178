"""hyperplex.inference.parameters: the table ``hyperplex params`` prints, counted without reading data."""

from conftest import prepared_task, write_tiny_config

from hyperplex.inference.parameters import params_report


def test_the_arithmetic_task_is_counted_with_the_vocabulary_it_will_have(tmp_path):
    # generated data: the character vocabulary is known without generating it, so the table is the model's own
    # count, not one built for data.vocab_size's default of 32,000 tokens
    import yaml

    path = write_tiny_config(tmp_path)
    config = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**config, "model_dir": str(tmp_path / "model")}))
    table, breakdown = params_report(str(path))
    cfg, task = prepared_task(str(path))
    model = task.build_model()
    assert breakdown["total"] == sum(p.numel() for p in model.parameters())
    assert f"(vocabulary {len(task.src_vocab)}, target vocabulary {len(task.tgt_vocab)})" in table
