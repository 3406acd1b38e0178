"""layers/selection.py: the one pattern dialect on a real module tree, the same selection from conversion and
adapters, and the dense layer types (GPT-2's Conv1D when transformers is installed)."""

import pytest
import torch
from torch import nn

from hyperplex.adapters import resolve_targets
from hyperplex.convert import convert_linears
from hyperplex.layers.selection import dense_sizes, dense_source, glob_patterns, name_matches
from hyperplex.models.transformer import TransformerConfig, TransformerTranslator


def translator():
    torch.manual_seed(0)
    config = TransformerConfig(d_model=16, num_heads=2, d_ff=32, encoder_layers=2, decoder_layers=1, dropout=0.0)
    return TransformerTranslator(config, 30, 30)


def linear_names(model):
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]


# pattern → the linear layers of the translator it selects
EXPECTED = {
    "qkv_proj": ["encoder.layers.0.self_attn.qkv_proj", "encoder.layers.1.self_attn.qkv_proj",
                 "decoder.layers.0.self_attn.qkv_proj"],
    "*.qkv_proj": ["encoder.layers.0.self_attn.qkv_proj", "encoder.layers.1.self_attn.qkv_proj",
                   "decoder.layers.0.self_attn.qkv_proj"],
    "ffn.linear1": ["encoder.layers.0.ffn.linear1", "encoder.layers.1.ffn.linear1", "decoder.layers.0.ffn.linear1"],
    "encoder.layers.1.*": ["encoder.layers.1.self_attn.qkv_proj", "encoder.layers.1.self_attn.out_proj",
                           "encoder.layers.1.ffn.linear1", "encoder.layers.1.ffn.linear2"],
    "*layers.0.ffn*": ["encoder.layers.0.ffn.linear1", "encoder.layers.0.ffn.linear2",
                       "decoder.layers.0.ffn.linear1", "decoder.layers.0.ffn.linear2"],
    "output_projection": ["output_projection"],
    "proj": [],  # a pattern names whole name parts: not qkv_proj or out_proj
    "linear": [],
}


@pytest.mark.parametrize("pattern", sorted(EXPECTED))
def test_the_dialect_on_a_real_module_tree(pattern):
    model = translator()
    names = linear_names(model)
    assert [n for n in names if name_matches(n, pattern)] == EXPECTED[pattern]


def test_conversion_and_adapters_select_the_same_layers():
    for pattern, expected in EXPECTED.items():
        if not expected:
            continue
        assert resolve_targets(translator(), [pattern], n=2) == expected
        model = translator()
        model.output_projection.weight = nn.Parameter(model.output_projection.weight.detach().clone())  # untied
        report = convert_linears(model, "phm", n=2, include=pattern, min_features=1)
        assert [r.name for r in report.converted] == expected, pattern


def test_name_matches_by_example():
    assert name_matches("encoder.layer.0.attention.self.query", "query")
    assert name_matches("query", "query") and not name_matches("query", "*.query")
    assert not name_matches("query_proj", "query") and not name_matches("encoder.query.bias", "query")
    assert name_matches("blocks.0", "0") and not name_matches("10", "0") and not name_matches("0.fc", "0")
    assert name_matches("bert.encoder.layer.3.output.dense", "encoder.layer.*")


def test_patterns_are_read_once_with_errors_naming_the_key():
    assert glob_patterns("query", "include") == ("query",)
    assert glob_patterns(None, "include") == () and glob_patterns(["a", "b"], "x") == ("a", "b")
    with pytest.raises(ValueError, match=r"targets must be a non-empty list of non-empty glob patterns, got \[\]"):
        glob_patterns([], "targets", required=True)
    with pytest.raises(ValueError, match=r"exclude must be a list of non-empty glob patterns, got \['a', 3\]"):
        glob_patterns(["a", 3], "exclude")
    with pytest.raises(ValueError, match=r"include must be a glob pattern or a list of glob patterns, got 5"):
        glob_patterns(5, "include")


def test_dense_layer_types():
    assert dense_source(nn.Linear(3, 5)) == "linear" and dense_sizes(nn.Linear(3, 5)) == (3, 5)
    assert dense_source(nn.Embedding(3, 5)) is None and dense_source(nn.Conv1d(3, 5, 1)) is None
    pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D

    conv = Conv1D(5, 3)  # (nf=out, nx=in): weight stored as (in, out)
    assert dense_source(conv) == "conv1d" and dense_sizes(conv) == (3, 5)


def test_conversions_take_any_linear_like_object():
    """``LinearLike`` is structural: a plain object with weight, bias and the two sizes converts exactly as the
    ``nn.Linear`` holding the same tensors does."""
    from dataclasses import dataclass

    from hyperplex import LowRankLinear, PHMLinear

    @dataclass
    class View:
        weight: torch.Tensor
        bias: torch.Tensor | None
        in_features: int
        out_features: int

    torch.manual_seed(0)
    linear = nn.Linear(8, 12)
    view = View(linear.weight.detach().clone(), linear.bias.detach().clone(), 8, 12)
    for convert in (lambda m: PHMLinear.from_linear(m, 4), lambda m: LowRankLinear.from_linear(m, 3)):
        (from_view, error_view), (from_linear, error_linear) = convert(view), convert(linear)
        assert error_view == error_linear
        for a, b in zip(from_view.state_dict().values(), from_linear.state_dict().values()):
            assert torch.equal(a, b)


def test_the_dialect_table_of_the_adapters_guide_is_what_name_matches_does():
    """docs/adapters.md's table of patterns: each example in "matches" is matched, each in "does not match" is not."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "adapters.md").read_text(encoding="utf-8")
    table = text[text.index("| pattern | selects | matches, e.g. | does not match, e.g. |"):].split("\n\n")[0]
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    assert len(rows) == 6
    for cells in rows:
        pattern = cells[0].strip("| `")
        matches, misses = (re.findall(r"`([^`]+)`", cell) for cell in cells[2:4])
        assert matches and misses, cells
        assert all(name_matches(name, pattern) for name in matches), (pattern, matches)
        assert not any(name_matches(name, pattern) for name in misses), (pattern, misses)
