"""int8 on torch.ao (today's hyperplex.int8) against torchao, side by side: accuracy and speed on one CPU thread.

For each layer kind at MiniLM's shapes (dense, low-rank at PHM n=4's parameter count, PHM n=4) and each batch
(rows of 32 tokens), the float layer, hyperplex's int8 layer (``torch.ao`` dynamic int8: per-channel int8
weights, per-tensor dynamic int8 activations) and the same computation with torchao's int8 tensors
(``Int8DynamicActivationInt8WeightConfig`` and ``Int8WeightOnlyConfig`` through ``quantize_``) are timed in
interleaved rounds (each variant's per-call time in a round of back-to-back calls; median of the rounds).
torchao quantises ``nn.Linear`` weights, so its low-rank layer is two ``nn.Linear`` and its PHM layer the
stacked (or side-by-side) ``Sᵢ`` as one ``nn.Linear``, mixed by the rule in float exactly as
:class:`hyperplex.int8.QuantizedPHMLinear` does.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/probes/int8_torchao.py            # ≈ 1 min on one core
    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/probes/int8_torchao.py --rounds 3 --shapes 384x384
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time
import warnings

import torch
from torch import nn

from hyperplex import Int8Config, LowRankLinear, PHMLinear, matching_rank, quantize
from hyperplex.layers.functional import mix_partial_products, premix_inputs, side_by_side

TOKENS = 32


class _TorchaoPHM(nn.Module):
    """A PHM layer whose ``Sᵢ`` sit in one ``nn.Linear`` (to be quantised by torchao), mixed in float."""

    rule: torch.Tensor
    bias: torch.Tensor

    def __init__(self, layer: PHMLinear) -> None:
        super().__init__()
        n, k, d = layer.n, layer.out_features, layer.in_features
        self.n, self.k, self.d, self.premixed = n, k, d, d <= k  # the path hyperplex's "auto" takes
        weight = layer.phm_weight.detach()
        stored = side_by_side(weight) if self.premixed else weight.reshape(k, d // n)
        self.blocks = nn.Linear(stored.shape[1], stored.shape[0], bias=False)
        with torch.no_grad():
            self.blocks.weight.copy_(stored)
        self.register_buffer("rule", layer.phm_rule.detach().clone())
        assert layer.bias is not None  # the probe's layers have a bias
        self.register_buffer("bias", layer.bias.detach().clone())

    def forward(self, x):
        lead = x.shape[:-1]
        if self.premixed:
            return self.blocks(premix_inputs(x, self.rule)).reshape(*lead, self.k) + self.bias
        blocks = x.reshape(-1, self.d // self.n)
        out = mix_partial_products(self.blocks(blocks), self.rule, blocks.shape[0] // self.n)
        return out.reshape(*lead, self.k) + self.bias


def torchao_form(layer: nn.Module) -> nn.Module:
    """``layer`` as ``nn.Linear`` modules that torchao's ``quantize_`` can take (same float function)."""
    if isinstance(layer, PHMLinear):
        return _TorchaoPHM(layer)
    if isinstance(layer, LowRankLinear):
        right, left = nn.Linear(layer.in_features, layer.rank, bias=False), nn.Linear(layer.rank, layer.out_features)
        with torch.no_grad():
            right.weight.copy_(layer.right), left.weight.copy_(layer.left)
            if layer.bias is not None:
                left.bias.copy_(layer.bias)
        return nn.Sequential(right, left)
    return copy.deepcopy(layer)


def layers(d: int, k: int) -> dict[str, nn.Module]:
    torch.manual_seed(0)
    dense = nn.Linear(d, k)
    phm, _ = PHMLinear.from_linear(dense, 4)
    lowrank, _ = LowRankLinear.from_linear(dense, matching_rank(d, k, 4))
    return {"dense": dense, "lowrank": lowrank, "phm4": phm}


def relative_error(ref, out) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def per_call_ms(fn, x, calls: int) -> float:
    """Mean milliseconds of one call over ``calls`` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - start) * 1e3 / calls


def calls_for(fn, x, target_ms: float) -> int:
    """How many back-to-back calls take about ``target_ms`` (at least one)."""
    return max(1, int(target_ms / max(per_call_ms(fn, x, 3), 1e-3)))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["384x384", "1536x384", "384x1536"], help="KxD (out x in)")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--round-ms", type=float, default=20.0, help="time of each variant in one round (ms)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import torchao
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

    print(f"# torch {torch.__version__}, torchao {torchao.__version__}, {platform.processor() or platform.machine()}, "
          f"1 thread, engine {torch.backends.quantized.engine}; rows = batch x {TOKENS} tokens; median of "
          f"{args.rounds} interleaved rounds of ~{args.round_ms:g} ms per variant; time as a ratio to the float "
          f"layer (lower is faster)")
    print(f"{'shape':>9} {'layer':>7} {'batch':>5} | {'float ms':>8} | {'rel.err torch.ao':>16} {'torchao-dyn':>11} "
          f"{'torchao-wo':>10} | {'x torch.ao':>10} {'x ao-dyn':>8} {'x ao-wo':>8}")
    for shape in args.shapes:
        k, d = map(int, shape.split("x"))
        for kind, layer in layers(d, k).items():
            variants = {"float": layer.eval()}
            variants["torch.ao"] = quantize(copy.deepcopy(nn.Sequential(layer)), Int8Config())
            torchao_configs = (("ao-dyn", Int8DynamicActivationInt8WeightConfig()), ("ao-wo", Int8WeightOnlyConfig()))
            for name, config in torchao_configs:
                form = torchao_form(layer).eval()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    quantize_(form, config)
                variants[name] = form
            for batch in args.batches:
                x = torch.randn(batch, TOKENS, d)
                with torch.inference_mode():
                    ref = layer(x)
                    errors = {name: relative_error(ref, f(x)) for name, f in variants.items() if name != "float"}
                    calls = {name: calls_for(f, x, args.round_ms) for name, f in variants.items()}  # + warm-up
                    times: dict[str, list[float]] = {name: [] for name in variants}
                    for _ in range(args.rounds):  # interleaved: every variant once per round
                        for name, f in variants.items():
                            times[name].append(per_call_ms(f, x, calls[name]))
                med = {name: statistics.median(t) for name, t in times.items()}
                print(f"{shape:>9} {kind:>7} {batch:>5} | {med['float']:8.3f} | {errors['torch.ao']:16.4f} "
                      f"{errors['ao-dyn']:11.4f} {errors['ao-wo']:10.4f} | {med['torch.ao'] / med['float']:10.2f} "
                      f"{med['ao-dyn'] / med['float']:8.2f} {med['ao-wo'] / med['float']:8.2f}")


if __name__ == "__main__":
    main()
