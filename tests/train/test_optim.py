import math

import pytest
import torch

from hyperplex.train.optim import (
    SCHEDULES,
    Constant,
    Halving,
    InverseSqrt,
    LinearDecay,
    apply_lr,
    build_optimizer,
    build_schedule,
)


def params():
    return [torch.nn.Parameter(torch.zeros(3))]


@pytest.mark.parametrize("name,cls", [("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW),
                                      ("sgd", torch.optim.SGD)])
def test_build_optimizer_types_and_hyperparameters(name, cls):
    opt = build_optimizer(params(), name, lr=0.5, weight_decay=0.1, momentum=0.9)
    assert type(opt) is cls
    group = opt.param_groups[0]
    assert group["lr"] == 0.5 and group["weight_decay"] == 0.1
    if name == "sgd":
        assert group["momentum"] == 0.9
    else:
        assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd"])
def test_a_fused_optimizer_makes_the_default_ones_updates(name):
    """``fused=True`` (what the trainer asks for on CUDA; torch also runs it on the CPU) is torch's fused
    implementation, and five updates with weight decay and momentum land where the default ones do, to rounding."""
    torch.manual_seed(0)
    start = [torch.randn(7, 5), torch.randn(5)]
    grads = [[torch.randn_like(p) for p in start] for _ in range(5)]
    finals = {}
    for fused in (False, True):
        params = [p.clone().requires_grad_() for p in start]
        opt = build_optimizer(params, name, lr=0.01, weight_decay=0.1, momentum=0.9, fused=fused)
        assert opt.defaults["fused"] is (True if fused else None)
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.clone()
            opt.step()
        finals[fused] = [p.detach() for p in params]
    for a, b in zip(finals[False], finals[True]):
        assert not torch.equal(a, start[0] if a.dim() == 2 else start[1])  # the updates moved the weights
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)


def test_build_optimizer_errors():
    with pytest.raises(ValueError, match="valid: adam, adamw, sgd"):
        build_optimizer(params(), "rmsprop", lr=1.0)
    with pytest.raises(ValueError, match="empty"):
        build_optimizer([], "adam", lr=1.0)
    with pytest.raises(ValueError, match="lr"):
        build_optimizer(params(), "sgd", lr=0.0)
    with pytest.raises(ValueError, match="betas"):
        build_optimizer(params(), "adam", lr=1.0, betas=(0.9, 1.5))


def test_apply_lr_sets_every_group():
    opt = torch.optim.SGD([{"params": params()}, {"params": params(), "lr": 3.0}], lr=1.0)
    assert apply_lr(opt, 0.25) == 0.25
    assert [g["lr"] for g in opt.param_groups] == [0.25, 0.25]


def test_constant():
    assert build_schedule("constant").lr(0.3, step=1, epoch=1) == 0.3
    assert Constant().lr(0.3, step=10_000, epoch=50) == 0.3


def test_inverse_sqrt_exact_values():
    s = build_schedule("inverse_sqrt", warmup_steps=4)
    assert s.lr(2.0, step=1, epoch=1) == 2.0 * 1 / 4
    assert s.lr(2.0, step=2, epoch=1) == 2.0 * 2 / 4
    assert s.lr(2.0, step=4, epoch=1) == 2.0  # peak at step = warmup
    assert s.lr(2.0, step=16, epoch=3) == pytest.approx(2.0 * math.sqrt(4 / 16)) == 1.0
    assert s.lr(2.0, step=100, epoch=9) == pytest.approx(2.0 * 0.2)


def test_inverse_sqrt_matches_vaswani_formula():
    d_model, warmup = 512, 4000
    s = InverseSqrt(warmup_steps=warmup)
    base = d_model ** -0.5 * warmup ** -0.5
    for step in (1, 100, 3999, 4000, 4001, 10_000, 100_000):
        vaswani = d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)  # Vaswani et al. eq. 3
        assert s.lr(base, step, 1) == pytest.approx(vaswani, rel=1e-12)


def test_halving_is_the_thesis_schedule():
    s = build_schedule("halving")  # lr 1.0, 12 epochs, halve every epoch after epoch 8 (thesis §4.1)
    lrs = [s.lr(1.0, step=1, epoch=e) for e in range(1, 13)]
    assert lrs == [1.0] * 8 + [0.5, 0.25, 0.125, 0.0625]
    assert Halving(start_epoch=2, factor=0.1).lr(1.0, step=7, epoch=4) == pytest.approx(0.01)


def test_linear_decay_exact_values():
    s = build_schedule("linear_decay", warmup_steps=2, total_steps=6)
    lrs = [s.lr(1.0, step=k, epoch=1) for k in range(1, 9)]
    assert lrs == [0.5, 1.0, 4 / 5, 3 / 5, 2 / 5, 1 / 5, 0.0, 0.0]
    assert LinearDecay(0, 4).lr(1.0, step=1, epoch=1) == 1.0


def test_schedules_are_pure():
    s = InverseSqrt(warmup_steps=10)
    first = [s.lr(1.0, k, 1) for k in range(1, 30)]
    assert [s.lr(1.0, k, 1) for k in reversed(range(1, 30))][::-1] == first


def test_to_dict_rebuilds():
    for s in (Constant(), InverseSqrt(7), Halving(3, 0.25), LinearDecay(2, 9)):
        d = s.to_dict()
        assert build_schedule(**d) == s


def test_schedule_errors():
    with pytest.raises(ValueError, match="valid: " + ", ".join(SCHEDULES)):
        build_schedule("cosine")
    with pytest.raises(ValueError, match="unknown argument.*warmup"):
        build_schedule("inverse_sqrt", warmup=4)
    with pytest.raises(ValueError, match="warmup_steps"):
        build_schedule("inverse_sqrt", warmup_steps=0)
    with pytest.raises(ValueError, match="total_steps"):
        build_schedule("linear_decay", warmup_steps=5, total_steps=3)
    with pytest.raises(ValueError, match="factor"):
        build_schedule("halving", factor=2.0)
    with pytest.raises(ValueError, match="1-based"):
        Constant().lr(1.0, step=0, epoch=1)
