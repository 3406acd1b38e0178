"""models/finetune.py: the model.adapter section applied to a tiny random BERT — exactly the right
parameters train, peft's own layers are present, LoRA/LoKr trainable counts match PHM's by the stated
rule (checked against an exhaustive search), the adapted encoder starts equal to the base, and bad
input names its key."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hyperplex.adapters import PHMAdaptedLinear, adapter_parameter_count
from hyperplex.config import ConfigError
from hyperplex.config.core import from_dict
from hyperplex.models.finetune import (
    FINETUNE_KINDS,
    LOKR_FACTORS,
    FineTuneConfig,
    FineTuneKind,
    FineTuneReport,
    attach,
    finetune_kind_names,
    match_peft_rank,
    peft_count,
    weights_signature,
)


def encoder(folder):
    return transformers.AutoModel.from_pretrained(folder, add_pooling_layer=False)


TARGETS = ["query", "value", "dense"]  # q, v, attention.output.dense, intermediate.dense, output.dense


def target_sizes(model) -> list[tuple[int, int]]:
    return [(m.in_features, m.out_features) for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in ("query", "value", "dense")]


def exhaustive(kind: str, sizes, target: int) -> int:
    """The smallest |count − target| over every r (and LoKr factor) peft allows: the rule's optimum."""
    factors = [-1] if kind == "lora" else [f for f in LOKR_FACTORS
                                           if f == -1 or all(d % f == 0 and k % f == 0 for d, k in sizes)]
    top = max(max(d, k) for d, k in sizes)
    return min(abs(peft_count(kind, sizes, r, f) - target) for f in factors for r in range(1, top + 1))


@pytest.mark.parametrize("kind", ["phm", "lora", "lokr", "full", "none"])
def test_exactly_the_adapter_trains(bert_folder, kind):
    if kind in ("lora", "lokr"):
        pytest.importorskip("peft")
    model = encoder(bert_folder)
    report = attach(model, FineTuneConfig(kind=kind, n=4, targets=TARGETS))
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    marker = {"phm": ".adapters.default.", "lora": "lora_", "lokr": "lokr_"}.get(kind)
    if kind == "full":
        assert trainable == {name for name, _ in model.named_parameters()}
    elif kind == "none":
        assert trainable == set() and report.adapter == 0
    else:
        assert trainable and all(marker in name for name in trainable)
        assert all(marker not in name for name, p in model.named_parameters() if not p.requires_grad)
        assert len(report.layers) == 10  # 5 targets × 2 layers
    assert report.adapter == sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("kind", ["lora", "lokr"])
def test_peft_rows_are_peft_s_own_layers(bert_folder, kind):
    peft = pytest.importorskip("peft")
    from peft.tuners.lokr import LoKrLayer
    from peft.tuners.lora import LoraLayer

    model = encoder(bert_folder)
    report = attach(model, FineTuneConfig(kind=kind, n=4, targets=["query", "value"]))
    layer_class = {"lora": LoraLayer, "lokr": LoKrLayer}[kind]
    modules = dict(model.named_modules())
    assert all(isinstance(modules[name], layer_class) for name in report.layers)
    wrapped = {name for name, m in modules.items() if isinstance(m, (LoraLayer, LoKrLayer))}
    assert wrapped == set(report.layers)  # nothing else (keys, dense layers) was touched
    assert not any(isinstance(m, PHMAdaptedLinear) for m in modules.values())
    assert peft.__version__


@pytest.mark.parametrize("kind", ["lora", "lokr"])
@pytest.mark.parametrize("n,rank", [(2, None), (4, None), (4, 1), (4, 2), (8, None), (8, 2)])
def test_matched_peft_count_is_the_closest_to_phm(bert_folder, kind, n, rank):
    pytest.importorskip("peft")
    model = encoder(bert_folder)
    sizes = target_sizes(model)
    phm = sum(adapter_parameter_count(d, k, n, rank) for d, k in sizes)
    report = attach(model, FineTuneConfig(kind=kind, n=n, rank=rank, targets=TARGETS))
    assert report.phm_count == phm  # the target is the PHM adapter on the same layers
    assert report.adapter == sum(p.numel() for p in model.parameters() if p.requires_grad)  # counted on the model
    # no r (and, for LoKr, no decompose_factor) peft allows comes closer to PHM's count
    assert abs(report.adapter - phm) == exhaustive(kind, sizes, phm)


def test_matched_count_of_a_phm_run_is_its_own(bert_folder):
    # the PHM count the peft rows match is what a PHM run really trains (shared rule counted once)
    for shared in (False, True):
        model = encoder(bert_folder)
        config = FineTuneConfig(kind="phm", n=4, rank=2, targets=TARGETS, shared_rule=shared)
        report = attach(model, config)
        sizes = target_sizes(encoder(bert_folder))
        expected = sum(adapter_parameter_count(d, k, 4, 2, rule=not shared or i == 0) for i, (d, k) in enumerate(sizes))
        assert report.adapter == expected


def test_lora_match_picks_the_nearest_rank():
    pytest.importorskip("peft")
    sizes = [(384, 384)] * 12
    r, _, count = match_peft_rank("lora", sizes, 12 * (384 * 384 // 4 + 64))
    assert count == r * 768 * 12  # peft's LoRA: r·(d + k) per layer
    assert all(abs(count - 12 * 36928) <= abs(other * 768 * 12 - 12 * 36928) for other in (r - 1, r + 1))


@pytest.mark.parametrize("kind", ["phm", "lora", "lokr"])
def test_the_adapted_encoder_starts_as_the_base(bert_folder, kind):
    if kind != "phm":
        pytest.importorskip("peft")
    base, adapted = encoder(bert_folder).eval(), encoder(bert_folder).eval()
    attach(adapted, FineTuneConfig(kind=kind, n=4, targets=TARGETS))
    ids = torch.tensor([[2, 5, 6, 7, 3, 0], [2, 8, 9, 3, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        assert torch.equal(adapted(input_ids=ids, attention_mask=mask).last_hidden_state,
                           base(input_ids=ids, attention_mask=mask).last_hidden_state)


def test_weights_signature_sees_every_byte(bert_folder):
    model = encoder(bert_folder)
    before = weights_signature(model)
    assert before == weights_signature(encoder(bert_folder))
    with torch.no_grad():
        model.encoder.layer[1].output.dense.bias[3] += 1e-7
    assert weights_signature(model) != before


def test_bad_input_names_the_key(bert_folder):
    with pytest.raises(ConfigError, match=r"model\.adapter\.kind: 'lorax' is not one of .*did you mean 'lora'"):
        from_dict(FineTuneConfig, {"kind": "lorax"}, "model.adapter")
    with pytest.raises(ConfigError, match=r"model\.adapter: n must be a positive integer"):
        from_dict(FineTuneConfig, {"n": 0}, "model.adapter")
    with pytest.raises(ConfigError, match=r"model\.adapter: targets must be a non-empty list"):
        from_dict(FineTuneConfig, {"targets": []}, "model.adapter")
    model = encoder(bert_folder)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"model\.adapter\.targets: pattern 'nothing' matches no nn.Linear"):
        attach(model, FineTuneConfig(kind="phm", targets=["query", "nothing"]))
    with pytest.raises(ValueError, match=r"model\.adapter\.targets: pattern 'LayerNorm' matches .*not linear layers"):
        attach(model, FineTuneConfig(kind="lora", targets=["LayerNorm"]))
    with pytest.raises(ValueError, match=r"model\.adapter\.n=5 must divide in and out features .*query \(32 → 32\)"):
        attach(model, FineTuneConfig(kind="phm", n=5, targets=["query"]))
    with pytest.raises(ValueError, match=r"model\.adapter\.n=3 must divide"):  # matching needs the PHM adapter too
        attach(model, FineTuneConfig(kind="lora", n=3, targets=["query"]))
    # nothing was changed by the refused calls
    assert (all(torch.equal(state[k], v) for k, v in model.state_dict().items())
            and state.keys() == model.state_dict().keys())
    assert all(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("kind", ["phm", "lora", "lokr"])
def test_the_seed_fixes_the_adapter_init(bert_folder, kind):
    if kind != "phm":
        pytest.importorskip("peft")

    def init(seed):
        torch.manual_seed(seed)
        model = encoder(bert_folder)
        attach(model, FineTuneConfig(kind=kind, n=4, rank=2, targets=["query", "value"]))
        return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}

    first, again, other = init(1), init(1), init(2)
    assert first.keys() == again.keys() == other.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first)  # the random factors differ with the seed


def test_every_kind_resolves_through_the_registry(bert_folder, monkeypatch):
    assert finetune_kind_names() == ("phm", "lora", "lokr", "full", "none")
    counts = {}
    for kind in finetune_kind_names():
        if kind in ("lora", "lokr"):
            pytest.importorskip("peft")
        model = encoder(bert_folder)
        report = attach(model, FineTuneConfig(kind=kind, n=4, rank=2, targets=["query"]))
        assert report.kind == kind and report.adapter == sum(p.numel() for p in model.parameters() if p.requires_grad)
        counts[kind] = report.adapter
    assert counts["none"] == 0 and counts["phm"] == 2 * (2 * (32 + 32) + 4 ** 3)  # 2 query layers, rank 2, n 4
    assert counts["full"] == sum(p.numel() for p in encoder(bert_folder).parameters())

    def biases_only(model, config):  # a new kind is one function and one registry line
        for name, p in model.named_parameters():
            p.requires_grad_(name.endswith("bias"))
        return FineTuneReport(config.kind, [], sum(p.numel() for p in model.parameters() if p.requires_grad))

    monkeypatch.setitem(FINETUNE_KINDS, "bias", FineTuneKind(biases_only))
    model = encoder(bert_folder)
    config = from_dict(FineTuneConfig, {"kind": "bias"}, "model.adapter")
    report = attach(model, config)
    assert report.adapter == sum(p.numel() for n, p in model.named_parameters() if n.endswith("bias")) > 0
    # what a model says of it and saves: the defaults (its count; checkpoints of the trainable tensors only)
    assert FINETUNE_KINDS["bias"].describe(report, config) == f"bias: {report.adapter:,} trainable parameters"
    assert not FINETUNE_KINDS["bias"].trains_base and FINETUNE_KINDS["full"].trains_base
    with pytest.raises(ConfigError, match=r"model\.adapter\.kind: 'biass' is not one of .*'bias'"):
        from_dict(FineTuneConfig, {"kind": "biass"}, "model.adapter")


@pytest.mark.parametrize("kind", ["phm", "lora"])
def test_exclude_leaves_the_layers_it_names(bert_folder, kind):
    """model.adapter.exclude: the selection vocabulary of conversion and int8; peft gets the exact names left."""
    if kind == "lora":
        pytest.importorskip("peft")
    model = encoder(bert_folder)
    report = attach(model, FineTuneConfig(kind=kind, n=4, targets=TARGETS, exclude=["intermediate.dense", "layer.0.*"]))
    assert len(report.layers) == 4 and all(".layer.1." in name or name.startswith("encoder.layer.1.")
                                           for name in report.layers)
    assert not any(name.endswith("intermediate.dense") for name in report.layers)
    assert FineTuneConfig(targets=TARGETS, exclude=["value"]).phm.exclude == ("value",)
    with pytest.raises(ValueError, match=r"model\.adapter\.exclude: pattern 'gate' matches no nn\.Linear"):
        attach(encoder(bert_folder), FineTuneConfig(kind=kind, n=4, targets=TARGETS, exclude=["gate"]))
