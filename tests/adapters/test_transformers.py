"""Adapters on transformers models built from a config (random weights, no download): BERT's
nn.Linear and GPT-2's Conv1D."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hyperplex.adapters import (  # noqa: E402
    PHMAdapterConfig,
    adapted_layers,
    adapter_state_dict,
    add_adapter,
    load_adapter,
    merge,
    save_adapter,
    trainable_parameters,
    unmerge,
)


def bert(seed=0):
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=16)
    return transformers.BertModel(config).eval()


def gpt2(seed=0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2, n_positions=16,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2Model(config).eval()


def inputs():
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, 50, (2, 9), generator=g)


def test_bert_adapter_identity_training_and_reload(tmp_path):
    model = bert()
    ids = inputs()
    base_out = model(ids).last_hidden_state
    base_before = {n: p.detach().clone() for n, p in model.named_parameters()}
    add_adapter(model, "a", PHMAdapterConfig(n=4, rank=2, targets=["query", "value"], shared_rule=True))
    assert sorted(p for p, _ in adapted_layers(model)) == [
        f"encoder.layer.{i}.attention.self.{m}" for i in range(2) for m in ("query", "value")]
    assert torch.equal(model(ids).last_hidden_state, base_out)
    assert trainable_parameters(model).trainable == 4 * 2 * (32 + 32) + 4 ** 3

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model(ids).last_hidden_state.square().mean().backward()
        optimizer.step()
    model.eval()
    for name, param in model.named_parameters():
        if ".adapters." not in name:
            assert torch.equal(param, base_before[name.replace(".base_layer", "")]), name
    adapted_out = model(ids).last_hidden_state
    assert not torch.allclose(adapted_out, base_out)

    save_adapter(model, "a", tmp_path)
    fresh = bert()
    load_adapter(fresh, tmp_path)
    assert torch.equal(fresh(ids).last_hidden_state, adapted_out)
    merge(fresh)
    assert torch.allclose(fresh(ids).last_hidden_state, adapted_out, rtol=1e-4, atol=1e-5)
    unmerge(fresh)
    for name, param in fresh.named_parameters():
        if ".adapters." not in name:
            assert torch.allclose(param, base_before[name.replace(".base_layer", "")], rtol=0, atol=1e-6), name


@pytest.mark.parametrize("rank", [None, 2])
def test_gpt2_conv1d_structured_equals_merged_and_round_trips(rank):
    model = gpt2().double()
    ids = inputs()
    base_out = model(ids).last_hidden_state
    weight_before = model.h[0].mlp.c_fc.weight.detach().clone()  # Conv1D: (in, out) = (32, 128)
    add_adapter(model, "a", PHMAdapterConfig(n=4, rank=rank, targets=["c_attn", "c_fc", "c_proj"]))
    assert len(dict(adapted_layers(model))) == 4
    assert torch.equal(model(ids).last_hidden_state, base_out)
    with torch.no_grad():
        for p in adapter_state_dict(model, "a").values():
            p.normal_(0, 0.1)
    structured = model(ids).last_hidden_state
    merge(model)
    layer = model.h[0].mlp.c_fc
    assert torch.allclose(layer.base_layer.weight, weight_before + layer.adapters["a"].delta_weight().T, atol=1e-12)
    assert torch.allclose(model(ids).last_hidden_state, structured, rtol=1e-9, atol=1e-9)
    unmerge(model)
    assert torch.allclose(layer.base_layer.weight, weight_before, rtol=0, atol=1e-12)
