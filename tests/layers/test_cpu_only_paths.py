"""The CPU-only paths refuse a tensor on another device by name, with what to do instead, before any work.

No GPU is needed: a tensor on the ``meta`` device stands in for a CUDA one (the checks look at ``device.type``)."""

from __future__ import annotations

import pytest
import torch

from hyperplex.int8.layers import QuantizedLinear, QuantizedPHMLinear
from hyperplex.layers import PHMLinear, native
from hyperplex.layers.functional import phm_linear_blocked, refuse_off_cpu


def _factors(device):
    gen = torch.Generator().manual_seed(0)
    rule, weight = torch.randn(4, 4, 4, generator=gen), torch.randn(4, 8, 8, generator=gen)
    return rule.to(device), weight.to(device)


def test_refuse_off_cpu_names_the_function_device_and_advice():
    refuse_off_cpu("f", "do g", torch.ones(2), None)  # CPU tensors and None pass
    with pytest.raises(ValueError, match=r"^f runs on the CPU only, got a tensor on meta: do g$"):
        refuse_off_cpu("f", "do g", torch.ones(2), torch.ones(2, device="meta"))


@pytest.mark.parametrize("off", ["x", "weight", "buffer"])
def test_blocked_refuses_a_tensor_off_the_cpu(off):
    rule, weight = _factors("cpu")
    x, buffer = torch.randn(3, 32), torch.empty(32 * 8)
    args = {"x": x, "weight": weight, "buffer": buffer}
    args[off] = args[off].to("meta")
    with torch.no_grad(), pytest.raises(ValueError, match=r"phm_linear_blocked runs on the CPU only, got a tensor "
                                                          r"on meta: on a GPU use F\.linear\(x, materialize_weight"):
        phm_linear_blocked(args["x"], rule, args["weight"], buffer=args["buffer"])


def test_phm_layer_off_the_cpu_never_takes_the_blocked_path(monkeypatch):
    """PHMLinear forms ``H`` whole off the CPU (here ``meta``): the blocked path is never called there."""
    import hyperplex.layers.phm as phm

    def fail(*args, **kwargs):
        raise AssertionError("phm_linear_blocked called for a tensor off the CPU")

    monkeypatch.setattr(phm, "phm_linear_blocked", fail)
    layer = PHMLinear(384, 384, 4, forward_mode="materialized").to("meta")
    from hyperplex.layers.dispatch import takes_blocked

    assert takes_blocked(384, 384, 4)  # on the CPU this layer would take the block columns
    with torch.no_grad():
        assert layer(torch.empty(5, 384, device="meta")).shape == (5, 384)


def test_native_kernel_refuses_a_tensor_off_the_cpu():
    """Refused before any build is tried, so this runs without a compiler."""
    rule, weight = _factors("meta")
    with torch.no_grad(), pytest.raises(ValueError, match=r"phm_linear_streamed \(the native kernel\) runs on the "
                                                          r"CPU only, got a tensor on meta: on a GPU leave the layer"):
        native.phm_linear_streamed(torch.empty(2, 32, device="meta"), rule, weight)


@pytest.mark.parametrize("path", ["int8", "premixed", "dequantized"])
def test_int8_layers_refuse_an_input_off_the_cpu(path):
    layer = QuantizedPHMLinear.from_float(PHMLinear(32, 16, 4), path=path)
    with pytest.raises(ValueError, match=r"int8 layer 'QuantizedPHMLinear' runs on the CPU only, got a tensor on "
                                         r"meta: PyTorch's quantised kernels are CPU-only; .*model\.cpu\(\)"):
        layer(torch.empty(3, 32, device="meta"))
    dense = QuantizedLinear.from_weight(torch.randn(16, 32), None)
    with pytest.raises(ValueError, match=r"int8 layer 'QuantizedLinear' runs on the CPU only"):
        dense(torch.empty(3, 32, device="meta"))
    x = torch.randn(3, 32)  # and on the CPU it still runs
    assert layer(x).shape == (3, 16) and dense(x).shape == (3, 16)
