"""What a conversion did, layer by layer: :class:`LayerReport` rows and the :class:`ConversionReport` table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["LayerReport", "ConversionReport"]


@dataclass
class LayerReport:
    """One dense layer the walk met.

    Attributes:
        name: dotted module name (``"encoder.layer.0.attention.self.query"``).
        source: ``"linear"`` (``nn.Linear``) or ``"conv1d"`` (``transformers``' GPT-2 ``Conv1D``).
        in_features, out_features: sizes ``d`` and ``k`` of the map ``(*, d) → (*, k)``.
        status: ``"converted"`` or ``"skipped"`` (left as it was; ``reason`` says why).
        kind: ``"phm"``, ``"lowrank"`` or ``"dense"`` (what the layer became); ``None`` when skipped.
        n, rank: the PHM ``n`` / the low-rank rank (``None`` where they do not apply).
        params_before, params_after: trainable parameters of the layer before / after (bias included).
        relative_error: ``‖W − H‖_F / ‖W‖_F`` of the new effective weight ``H`` against the old ``W``
            (measured in float64 on the stored factors); ``None`` when skipped.
        reason: why a layer was skipped (``""`` when converted).
        output_error: ``‖(W − H) F‖_F / ‖W F‖_F`` on the calibration inputs (``F Fᵀ = Xᵀ X``), when
            the conversion was given ``calibrate=``; else ``None``.
        output_error_svd: the same for the SVD start, with ``init="activation"`` (before refinement).
    """

    name: str
    source: str
    in_features: int
    out_features: int
    status: str
    kind: str | None = None
    n: int | None = None
    rank: int | None = None
    params_before: int = 0
    params_after: int = 0
    relative_error: float | None = None
    reason: str = ""
    output_error: float | None = None
    output_error_svd: float | None = None


@dataclass
class ConversionReport:
    """The layers a :func:`hyperplex.compress` (or ``to_dense``) call met, and totals.

    Attributes:
        layers: one :class:`LayerReport` per candidate layer, in module order.
        model_params_before, model_params_after: distinct trainable-or-not parameters of the whole
            module (tied weights counted once) before and after.
    """

    layers: list[LayerReport] = field(default_factory=list)
    model_params_before: int = 0
    model_params_after: int = 0

    @property
    def converted(self) -> list[LayerReport]:
        return [layer for layer in self.layers if layer.status == "converted"]

    @property
    def skipped(self) -> list[LayerReport]:
        return [layer for layer in self.layers if layer.status == "skipped"]

    @property
    def converted_params_before(self) -> int:
        return sum(layer.params_before for layer in self.converted)

    @property
    def converted_params_after(self) -> int:
        return sum(layer.params_after for layer in self.converted)

    @property
    def mean_output_error(self) -> float | None:
        """Unweighted mean of the converted layers' relative output errors (``None`` without calibration)."""
        errors = [layer.output_error for layer in self.converted if layer.output_error is not None]
        return sum(errors) / len(errors) if errors else None

    @property
    def mean_relative_error(self) -> float | None:
        """Unweighted mean of the converted layers' relative weight errors (``None`` if none)."""
        errors = [layer.relative_error for layer in self.converted if layer.relative_error is not None]
        return sum(errors) / len(errors) if errors else None

    def to_dict(self) -> dict:
        """JSON-ready: ``{"layers": [...], "totals": {...}}``."""
        return {
            "layers": [asdict(layer) for layer in self.layers],
            "totals": {
                "converted_layers": len(self.converted),
                "skipped_layers": len(self.skipped),
                "converted_params_before": self.converted_params_before,
                "converted_params_after": self.converted_params_after,
                "model_params_before": self.model_params_before,
                "model_params_after": self.model_params_after,
                "mean_relative_error": self.mean_relative_error,
                "mean_output_error": self.mean_output_error,
            },
        }

    def __str__(self) -> str:
        header = ("layer", "shape", "kind", "params before", "params after", "rel. error")
        rows = []
        for layer in self.layers:
            shape = f"{layer.out_features}x{layer.in_features}" + (" (Conv1D)" if layer.source == "conv1d" else "")
            if layer.status == "converted":
                kind = f"{layer.kind}" + (f" n={layer.n}" if layer.n is not None else "") + (
                    f" r={layer.rank}" if layer.rank is not None else "")
                error = f"{layer.relative_error:.4f}" if layer.relative_error is not None else "-"
                rows.append((layer.name, shape, kind, f"{layer.params_before:,}", f"{layer.params_after:,}", error))
            else:
                rows.append((layer.name, shape, "dense", f"{layer.params_before:,}", "-", f"skipped: {layer.reason}"))
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(5)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)) + "  " + header[5]]
        lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) + "  " + r[5] for r in rows]
        return "\n".join([*lines, *self.summary()])

    def summary(self) -> list[str]:
        """The two closing lines of the table: the converted layers' parameters and mean errors, and the whole
        model's parameters (what a training log records of a conversion)."""

        def ratio(before: int, after: int) -> str:
            if not after or not before:
                return "-"
            return f"{before / after:.2f}x fewer" if after <= before else f"{after / before:.2f}x more"

        mean = self.mean_relative_error
        return [f"converted {len(self.converted)} of {len(self.layers)} layers: "
                f"{self.converted_params_before:,} -> {self.converted_params_after:,} parameters "
                f"({ratio(self.converted_params_before, self.converted_params_after)})"
                + (f", mean relative error {mean:.4f}" if mean is not None else "")
                + (f", mean output error {self.mean_output_error:.4f}" if self.mean_output_error is not None else ""),
                f"whole model: {self.model_params_before:,} -> {self.model_params_after:,} parameters "
                f"({ratio(self.model_params_before, self.model_params_after)})"]
