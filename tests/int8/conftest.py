"""The converted-model fixtures of ``tests/convert`` (int8 models are built from converted ones)."""

from convert.conftest import tiny_gpt2, tiny_sentence_transformer  # noqa: F401
