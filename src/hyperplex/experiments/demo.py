"""``hyperplex demo``: the PHM paper's Figure 2 on generated data.

(a) A PHM layer learns a 3-D rotation ``y = W x`` from examples (§3.2, Fig. 2a).
(b) A learned rule recovers a hypercomplex multiplication from examples of products
    ``(q, p) → q ⊗ p`` (§3.3, Fig. 2b). The components of ``q`` play the role of the 1×1
    blocks ``Sᵢ``, so the prediction is ``H(q) p`` with ``H(q) = Σᵢ Aᵢ ⊗ [qᵢ]`` (eq. 3.3–3.5).
    The map ``(q, p) ↦ q ⊗ p`` is bilinear and its coefficients are exactly the rule entries,
    so the fit is unique and the learned ``Aᵢ`` must equal the algebra's table; we report the
    largest absolute difference. Done for quaternions (n = 4) and octonions (n = 8).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from hyperplex.algebra import algebra_rule, multiply
from hyperplex.layers import PHMLinear

__all__ = ["DemoResult", "learn_rotation", "learn_rule", "run_demo"]


@dataclass
class DemoResult:
    task: str
    n: int
    parameters: int
    losses: list[float] = field(default_factory=list)
    rule_error: float | None = None  # max |A_learned − A_true|, when the rule is identifiable
    learned_rule: Tensor | None = None
    true_rule: Tensor | None = None

    @property
    def final_loss(self) -> float:
        return self.losses[-1]


def rotation_matrix(axis: Tensor, angle: float) -> Tensor:
    """Rodrigues' formula: rotation by ``angle`` about the unit ``axis`` (3,)."""
    x, y, z = (axis / axis.norm()).tolist()
    K = torch.tensor([[0.0, -z, y], [z, 0.0, -x], [-y, x, 0.0]])
    return torch.eye(3) + math.sin(angle) * K + (1 - math.cos(angle)) * K @ K


def learn_rotation(steps: int, seed: int = 0, n: int = 3, batch: int = 64) -> DemoResult:
    """Fit ``PHMLinear(3, 3, n, bias=False)`` to ``y = W x`` for a random rotation ``W``."""
    gen = torch.Generator().manual_seed(seed)
    W = rotation_matrix(torch.randn(3, generator=gen), float(torch.rand(1, generator=gen)) * math.pi)
    torch.manual_seed(seed)
    layer = PHMLinear(3, 3, n, bias=False)
    opt = torch.optim.Adam(layer.parameters(), lr=0.03)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    result = DemoResult("3-D rotation", n, sum(p.numel() for p in layer.parameters()))
    for _ in range(steps):
        x = torch.randn(batch, 3, generator=gen)
        loss = nn.functional.mse_loss(layer(x), x @ W.T)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        result.losses.append(loss.item())
    return result


def learn_rule(algebra: str, steps: int, seed: int = 0, batch: int = 256) -> DemoResult:
    """Learn the ``(n, n, n)`` rule of ``algebra`` from products ``q ⊗ p`` of random numbers."""
    true_rule = algebra_rule(algebra)
    n = true_rule.shape[0]
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    rule = nn.Parameter(torch.randn(n, n, n) / math.sqrt(n))  # PHMLinear's init for learned rules
    opt = torch.optim.Adam([rule], lr=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    result = DemoResult(f"{algebra} product", n, rule.numel(), true_rule=true_rule)
    for _ in range(steps):
        q, p = torch.randn(batch, n, generator=gen), torch.randn(batch, n, generator=gen)
        target = multiply(q, p, true_rule)  # q ⊗ p
        H = torch.einsum("iac,bi->bac", rule, q)  # Σᵢ Aᵢ ⊗ [qᵢ], one H per example
        loss = nn.functional.mse_loss(torch.einsum("bac,bc->ba", H, p), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        result.losses.append(loss.item())
    result.learned_rule = rule.detach().clone()
    result.rule_error = float((result.learned_rule - true_rule).abs().max())
    return result


def _plot(results: list[DemoResult], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        ax.semilogy(r.losses, label=f"{r.task} (n={r.n})")
    ax.set(xlabel="step", ylabel="MSE loss", title="PHM layers learning rotations and products")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "loss_curves.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    for r in results:
        if r.learned_rule is None:
            continue
        n = r.n
        # Constrained layout with one sub-figure per row: each row's title and the axes titles
        # get their own space (tight_layout packed the square images so that the bottom row's
        # titles overlapped the row above).
        fig = plt.figure(figsize=(1.6 * n, 4.4), layout="constrained")
        fig.suptitle(f"{r.task}: learned vs true rule (max |diff| = {r.rule_error:.1e})", fontsize=9)
        rows = fig.subfigures(2, 1, squeeze=False)[:, 0]
        for sub, (name, tensor) in zip(rows, (("learned", r.learned_rule), ("true", r.true_rule))):
            assert tensor is not None  # the learned rule was checked above; the true one is always set
            sub.suptitle(f"{name} $A_i$", fontsize=8)
            for i, a in enumerate(sub.subplots(1, n, squeeze=False)[0]):
                a.imshow(tensor[i].numpy(), cmap="coolwarm", vmin=-1, vmax=1)
                a.set_xticks([])
                a.set_yticks([])
                a.set_title(f"$A_{{{i + 1}}}$", fontsize=8)
        paths.append(out / f"rule_{r.task.split()[0]}.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


def run_demo(out: str | Path = "runs/demo", quick: bool = False, seed: int = 0, echo=print,
             threads: int | None = None) -> list[DemoResult]:
    """Run the three experiments, print a table, write plots into ``out``; returns the results.

    ``threads``: torch CPU threads; 0/``None`` = :func:`hyperplex.threads.choose_threads` for the
    largest product here (256 rows × 8², the octonion fit), which is one thread: these models are
    far too small to gain from a second, and lose 5-10× to it on a shared machine."""
    from hyperplex.threads import set_threads

    set_threads(threads, rows=256, width=8)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    steps = ({"rotation": 300, "quaternion": 300, "octonion": 400} if quick
             else {"rotation": 2000, "quaternion": 1500, "octonion": 2500})
    start = time.perf_counter()
    results = [
        learn_rotation(steps["rotation"], seed),
        learn_rule("quaternion", steps["quaternion"], seed),
        learn_rule("octonion", steps["octonion"], seed),
    ]
    echo(f"{'task':<20} {'n':>3} {'params':>7} {'final loss':>11} {'rule error':>11}")
    for r in results:
        err = "-" if r.rule_error is None else f"{r.rule_error:.2e}"
        echo(f"{r.task:<20} {r.n:>3} {r.parameters:>7} {r.final_loss:>11.2e} {err:>11}")
    for path in _plot(results, out):
        echo(f"wrote {path}")
    echo(f"done in {time.perf_counter() - start:.1f} s (rule error = max |learned A_i - true A_i|)")
    return results
