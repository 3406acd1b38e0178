from pathlib import Path

from hyperplex.config.reference import config_reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_config_reference_is_up_to_date():
    # docs/config.md is generated from the config classes; regenerate with
    # `python -m hyperplex.config.reference > docs/config.md` after changing any config field.
    assert DOC.read_text(encoding="utf-8") == config_reference()


def test_reference_covers_every_architecture_and_nested_defaults():
    text = config_reference()
    for name in ("rnn_translator", "transformer", "nli_encoder", "decomposable_attention", "quaternion_attention"):
        assert f"`architecture: {name}`" in text
    assert "`training.lr`" in text and "`testing.beam_size`" in text and "`model.linear.kind`" in text
