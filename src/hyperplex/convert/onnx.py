"""ONNX export of converted encoders and of any module with example inputs, holding the factors, not ``H``.

:func:`export_onnx` traces the model with PyTorch's TorchScript-based exporter
(``torch.onnx.export(..., dynamo=False)``) with dynamic batch and sequence axes. Every
:class:`~hyperplex.layers.PHMLinear` is traced through a kernel that never forms ``H``
(:func:`phm_linear_premixed` by default, see :data:`PHM_MODES`), whatever the layer's own forward mode
or cache, so the graph stores the ``Sᵢ`` and ``Aᵢ``, never ``H``; a
:class:`~hyperplex.layers.LowRankLinear` is stored as its factors ``left`` and ``right``. The file is therefore about
the factors' bytes (:func:`~hyperplex.convert.model_bytes` of the float model plus the graph).

Why TorchScript and not the dynamo exporter: both give the same outputs, but on a 2-layer random BERT with
PHM layers the dynamo exporter is about 20× slower and writes a file about 3× larger. ``dynamo=True`` is
accepted for users who want it.

The file is written atomically (a temporary file in the target folder, checked in onnxruntime when
it is installed, then renamed), so an error leaves no file behind and an existing file unchanged.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyperplex.convert.serialize import _is_sentence_transformer, _is_transformers_model
from hyperplex.fileio import default_file_mode, temporary_sibling
from hyperplex.layers.functional import materialize_weight, phm_linear_premixed, phm_linear_structured
from hyperplex.layers.phm import PHMLinear

__all__ = ["export_onnx", "export_onnx_folder", "ExportError", "ExportResult", "ONNX_TOLERANCE", "PHM_MODES",
           "phm_linear_premixed", "unsupported_layers"]

#: onnxruntime's outputs must equal PyTorch's within ``ONNX_TOLERANCE × max(1, max |PyTorch output|)``
#: (max abs difference). Both run float32; they differ only by the order of additions in the matmuls
#: and reductions (measured: 5e-7 on a random BERT, 2–3e-7 on MiniLM's sentence embeddings).
ONNX_TOLERANCE = 1e-4


class ExportError(ValueError):
    """A model cannot be exported; the message names the layer or the argument."""


@dataclass
class ExportResult:
    """What :func:`export_onnx` wrote: ``path``, its size in ``bytes``, the graph's ``input_names`` and
    ``output_names``, and ``max_abs_diff``, the largest difference between onnxruntime's and PyTorch's
    outputs over the checked inputs (``None`` when onnxruntime is not installed or ``verify=False``)."""

    path: str
    bytes: int
    input_names: list[str]
    output_names: list[str]
    max_abs_diff: float | None = None


def unsupported_layers(model: nn.Module) -> list[tuple[str, str]]:
    """``(name, reason)`` for each layer the exporter cannot write: int8 layers (PyTorch's dynamic int8
    kernels have no ONNX form here; export the float model, then quantise the ONNX file with
    ``onnxruntime.quantization.quantize_dynamic`` if wanted)."""
    found = []
    for name, module in model.named_modules():
        kind = type(module)
        if kind.__module__.startswith("torch.ao.nn.quantized") or kind.__name__ in (
                "QuantizedLinear", "QuantizedLowRankLinear", "QuantizedPHMLinear"):
            found.append((name or "(root)", f"{kind.__name__} is an int8 layer; export the float model"))
    outer = [n for n, _ in found]
    return [(n, r) for n, r in found if not any(n.startswith(f"{o}.") for o in outer if o != n)]


#: How a PHM layer is written; the file holds only ``Aᵢ`` and ``Sᵢ`` in every mode.
#: ``"premixed"`` (default): :func:`phm_linear_premixed`, input blocks mixed by the rule, then one GEMM
#: against the ``Sᵢ`` side by side. ``"structured"``: :func:`~hyperplex.layers.phm_linear_structured`, one
#: GEMM over the input blocks, then the ``n²`` partial products mixed by the rule. ``"materialized"``: the
#: graph forms ``H`` with a matmul and a transpose, then one dense matmul; onnxruntime folds ``H`` into a
#: constant when it opens the session (dense speed, dense memory while running). In onnxruntime, premixed
#: is the fastest of the three that keep the factors (benchmarks/probes/check_deploy.py; docs/compress.md has the
#: ratios).
PHM_MODES = ("premixed", "structured", "materialized")


@contextlib.contextmanager
def _phm_forward(model: nn.Module, mode: str) -> Iterator[None]:
    """Every PHM layer (``n > 1``) traced as ``mode`` (:data:`PHM_MODES`), whatever its own forward mode or
    cache; restored on exit."""
    layers = [m for m in model.modules() if isinstance(m, PHMLinear) and m.n > 1]

    def structured(layer: PHMLinear):
        return lambda x: phm_linear_structured(x, layer.phm_rule, layer.factors(), layer.bias)

    def materialized(layer: PHMLinear):
        return lambda x: F.linear(x, materialize_weight(layer.phm_rule, layer.factors()), layer.bias)

    def premixed(layer: PHMLinear):
        return lambda x: phm_linear_premixed(x, layer.phm_rule, layer.factors(), layer.bias)

    build = {"premixed": premixed, "structured": structured, "materialized": materialized}[mode]
    try:
        for m in layers:
            m.__dict__["forward"] = build(m)  # an instance attribute: nn.Module.__call__ takes it over forward
        yield
    finally:
        for m in layers:
            m.__dict__.pop("forward", None)


class _SentenceEncoder(nn.Module):
    """A SentenceTransformer as ``(input_ids, attention_mask) → sentence_embedding`` ``(B, dim)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.model({"input_ids": input_ids, "attention_mask": attention_mask})["sentence_embedding"]


class _TokenEncoder(nn.Module):
    """A ``transformers`` model as ``(input_ids, attention_mask) → its first output`` (``last_hidden_state``
    ``(B, T, d)`` for an encoder, ``logits`` for a head model)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask)[0]


def _token_inputs(vocab_size: int, rows: int = 2, length: int = 8) -> tuple[Tensor, Tensor]:
    """``rows`` rows of ``length`` token ids in ``[1, vocab_size)`` (fixed seed), the last one padded after
    ``length − 3`` tokens."""
    generator = torch.Generator().manual_seed(rows)
    ids = torch.randint(1, max(2, vocab_size), (rows, length), generator=generator)
    mask = torch.ones_like(ids)
    mask[-1, length - 3:] = 0
    return ids, mask


def _prepare(model: nn.Module, sentence_embedding: bool, example_inputs, check_inputs, input_names, output_names):
    """(module to trace, example inputs, inputs of other sizes to check or None, input names, output names,
    whether the outputs are per token)."""
    token_names = ["input_ids", "attention_mask"]
    foreign: Any = model  # a sentence-transformers or transformers model: their attributes, not nn.Module's
    if _is_sentence_transformer(model):
        auto_model = foreign[0].auto_model
        inputs, other = _token_inputs(auto_model.config.vocab_size), _token_inputs(auto_model.config.vocab_size, 3, 11)
        if sentence_embedding:
            return _SentenceEncoder(model), inputs, other, token_names, ["sentence_embedding"], False
        return _TokenEncoder(auto_model), inputs, other, token_names, ["last_hidden_state"], True
    if _is_transformers_model(model):
        inputs, other = _token_inputs(foreign.config.vocab_size), _token_inputs(foreign.config.vocab_size, 3, 11)
        with torch.no_grad():
            first = next(iter(model(input_ids=inputs[0], attention_mask=inputs[1]).keys()))
        return _TokenEncoder(model), inputs, other, token_names, [first], first != "pooler_output"
    if example_inputs is None:
        raise ExportError(f"{type(model).__name__} is not a SentenceTransformer or transformers model: pass "
                          f"example_inputs=(tensor, ...) (and input_names/output_names) to export it")
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    names = list(input_names or [f"input_{i}" for i in range(len(inputs))])
    if len(names) != len(inputs):
        raise ExportError(f"input_names has {len(names)} names for {len(inputs)} example inputs")
    if check_inputs is not None:
        check_inputs = tuple(check_inputs) if isinstance(check_inputs, (tuple, list)) else (check_inputs,)
        if len(check_inputs) != len(inputs):
            raise ExportError(f"check_inputs has {len(check_inputs)} tensors for {len(inputs)} example inputs")
    return model, inputs, check_inputs, names, list(output_names or ["output"]), None


def _dynamic_axes(inputs: Sequence[Tensor], input_names: list[str], output_names: list[str], outputs,
                  sequence_output: bool | None) -> dict[str, dict[int, str]]:
    """Batch (axis 0) and, for inputs of two or more axes, sequence (axis 1) are dynamic; outputs: batch,
    and sequence where the output is per token."""
    axes = {}
    for name, tensor in zip(input_names, inputs):
        axes[name] = {0: "batch", 1: "sequence"} if tensor.dim() >= 2 else {0: "batch"}
    outs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    sequence_len = next((t.shape[1] for t in inputs if t.dim() >= 2), None)
    for name, tensor in zip(output_names, outs):
        per_token = sequence_output if sequence_output is not None else (
            tensor.dim() >= 3 and sequence_len is not None and tensor.shape[1] == sequence_len)
        axes[name] = {0: "batch", 1: "sequence"} if per_token and tensor.dim() >= 2 else {0: "batch"}
    return axes


def _run_onnxruntime(path: str, input_names: list[str], inputs: Sequence[Tensor]) -> list:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = max(1, torch.get_num_threads())
    options.log_severity_level = 4  # failures come back as exceptions, reworded by the caller
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    graph_inputs = [i.name for i in session.get_inputs()]
    lost = [name for name in input_names if name not in graph_inputs]
    if lost:
        raise ExportError(f"the traced graph does not read input {lost[0]!r}: the model's output does not depend on "
                          f"it through torch operations (a Python-side computation was frozen into a constant)")
    try:
        return session.run(None, {name: tensor.numpy() for name, tensor in zip(input_names, inputs)})
    except Exception as err:  # noqa: BLE001 - onnxruntime's own error types
        raise ExportError(f"onnxruntime cannot run the exported graph ({type(err).__name__}: "
                          f"{str(err).strip().splitlines()[0] if str(err).strip() else ''})") from err


def export_onnx(model: nn.Module, path: str | os.PathLike, *, sentence_embedding: bool = True,
                example_inputs: Tensor | Sequence[Tensor] | None = None,
                check_inputs: Tensor | Sequence[Tensor] | None = None, input_names: Sequence[str] | None = None,
                output_names: Sequence[str] | None = None, phm: str = "premixed", opset: int = 17,
                dynamo: bool = False, verify: bool = True) -> ExportResult:
    """Write ``model`` as an ONNX graph to ``path``; return an :class:`ExportResult`.

    Args:
        model: a ``SentenceTransformer`` (converted or not; :func:`~hyperplex.convert.load_converted`
            gives one), a ``transformers`` model, or any ``nn.Module`` with ``example_inputs``.
            Graph inputs and outputs:

            * ``SentenceTransformer``: ``input_ids``, ``attention_mask`` ``(batch, sequence)`` int64 →
              ``sentence_embedding`` ``(batch, dim)`` (the model's pooling and normalisation included);
              with ``sentence_embedding=False`` its transformer alone → ``last_hidden_state``
              ``(batch, sequence, d)``, the layout sentence-transformers' ONNX backend reads;
            * ``transformers`` model: ``input_ids``, ``attention_mask`` → its first output
              (``last_hidden_state`` or ``logits``);
            * other modules: ``example_inputs`` (one tensor or a tuple), named ``input_names``
              (default ``input_0``, …) → ``output_names`` (default ``output``). Axis 0 of every input is
              the batch, axis 1 of inputs with two or more axes the sequence (e.g. hyperplex's
              ``TransformerClassifier``: ``tokens`` ``(B, T)``, ``lengths`` ``(B,)`` → ``logits`` ``(B, C)``).
        path: the ``.onnx`` file; its folder must exist. Replaced atomically if it exists.
        sentence_embedding: see ``model``.
        check_inputs: for a module with ``example_inputs``: inputs of other batch and sequence sizes that the
            file must also run on (a size fixed at trace time fails there). For sentence-transformers and
            ``transformers`` models, 3 × 11 token ids are used.
        phm: how PHM layers are written (:data:`PHM_MODES`); every mode keeps only ``Aᵢ``, ``Sᵢ`` in the file.
            ``"premixed"`` (default) and ``"structured"``: ``H`` never exists, also not in onnxruntime's
            memory. ``"materialized"``: the graph forms ``H``; onnxruntime folds it into a constant when the
            session opens, so it runs at the dense model's speed and holds the dense weights while running.
        opset: ONNX opset (default 17).
        dynamo: use the dynamo-based exporter instead of the TorchScript one (slower, larger files).
        verify: run the file in onnxruntime (when installed) on the example inputs and require
            ``max |ORT − PyTorch| ≤ ONNX_TOLERANCE × max(1, max |PyTorch|)`` before renaming it into place.

    Raises:
        ExportError: a layer the exporter cannot write (naming the layer: int8 layers); a plain module
            without ``example_inputs``; a missing target folder; outputs of onnxruntime that differ from
            PyTorch's. Nothing is written then.
    """
    path = os.fspath(path)
    folder = _check_export(model, path, phm)
    was_training = model.training
    model.eval()
    try:
        with _phm_forward(model, phm), torch.no_grad():
            module, inputs, other, names, outputs_names, sequence_output = _prepare(
                model, sentence_embedding, example_inputs, check_inputs, input_names, output_names)
            reference = module(*inputs)
            checks = [(inputs, reference)] + ([] if other is None else [(other, module(*other))])
            axes = _dynamic_axes(inputs, names, outputs_names, reference, sequence_output)
            handle, tmp = tempfile.mkstemp(dir=folder, prefix=".export-", suffix=".onnx")
            os.close(handle)
            try:
                _trace(model, module, inputs, tmp, names, outputs_names, axes, opset, dynamo, phm)
                diff = _verify(model, path, tmp, names, checks) if verify else None
                os.chmod(tmp, default_file_mode())  # mkstemp's 0600 → what a plain open() would give
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(tmp)
                raise
    finally:
        model.train(was_training)
    return ExportResult(path, os.path.getsize(path), names, outputs_names, diff)


def _check_phm_mode(phm: str) -> None:
    if phm not in PHM_MODES:
        raise ExportError(f"unknown phm mode {phm!r}; valid: {', '.join(PHM_MODES)}")


def _check_export(model: nn.Module, path: str, phm: str) -> str:
    """What :func:`export_onnx` refuses before tracing (an unknown ``phm`` mode, a layer the exporter cannot
    write, a missing folder, a folder as the path, no ``onnx`` package); returns the file's folder."""
    _check_phm_mode(phm)
    bad = unsupported_layers(model)
    if bad:
        name, reason = bad[0]
        raise ExportError(f"cannot export {type(model).__name__} to ONNX: layer {name!r}: {reason}"
                          + (f" ({len(bad)} such layers)" if len(bad) > 1 else ""))
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ExportError(f"{path}: folder {folder} does not exist")
    if os.path.isdir(path):
        raise ExportError(f"{path}: is a folder; give the .onnx file's path")
    try:
        import onnx  # noqa: F401  (the exporter needs it)
    except ImportError:
        raise ExportError("ONNX export needs the onnx package: pip install 'hyperplex[onnx]'") from None
    return folder


def _trace(model: nn.Module, module: nn.Module, inputs: Sequence[Tensor], tmp: str, names: list[str],
           output_names: list[str], axes: dict, opset: int, dynamo: bool, phm: str) -> None:
    """``module`` (``model`` wrapped for its graph inputs and outputs) exported to the file ``tmp``; an exporter
    failure becomes an :class:`ExportError` naming ``model``'s class and the first line of the cause."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python-side shape checks
        try:
            torch.onnx.export(module, tuple(inputs), tmp, input_names=names, output_names=output_names,
                              opset_version=opset, dynamo=dynamo,
                              do_constant_folding=phm != "materialized",  # folding would store H
                              dynamic_axes=axes)
        except Exception as err:  # noqa: BLE001 - the exporter raises many types
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ExportError(f"cannot export {type(model).__name__} to ONNX: the exporter failed "
                              f"({type(err).__name__}: {first})") from err


def _verify(model: nn.Module, path: str, tmp: str, names: list[str], checks: list) -> float | None:
    """The file ``tmp`` run in onnxruntime on each ``(inputs, PyTorch outputs)`` of ``checks``: the largest
    difference, or None without onnxruntime. Outputs beyond the tolerance, or a failure on the second
    inputs' sizes (a size fixed at trace time), are an :class:`ExportError`."""
    diff = None
    for i, (feed, expected) in enumerate(checks):
        sizes = " and ".join(str(tuple(t.shape)) for t in feed)
        try:
            got = _run_onnxruntime(tmp, names, feed)
        except ImportError:
            break
        except ExportError as err:
            if i == 0:
                raise
            raise ExportError(f"cannot export {type(model).__name__} to ONNX: the graph traced at one size "
                              f"does not run on inputs of {sizes} (a size was fixed at trace time): "
                              f"{err}") from None
        refs = expected if isinstance(expected, (tuple, list)) else (expected,)
        error = max(float((torch.from_numpy(g) - r.float()).abs().max()) for g, r in zip(got, refs))
        scale = max(1.0, max(float(r.abs().max()) for r in refs))
        if error > ONNX_TOLERANCE * scale:
            raise ExportError(f"{path}: onnxruntime's output differs from PyTorch's by {error:.3g} on inputs "
                              f"of {sizes} (allowed {ONNX_TOLERANCE * scale:.3g}); the file was not written")
        diff = error if diff is None else max(diff, error)
    return diff


# ----------------------------------------------------------------------------- a folder sentence-transformers loads
#: Files that hold a folder's PyTorch weights (or another ONNX graph) and hyperplex's own records: the ONNX folder
#: of :func:`export_onnx_folder` leaves them out, since its graph carries the transformer's weights.
_LEFT_OUT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".onnx_data")
#: Folders of other exports of the source model (sentence-transformers' ONNX and OpenVINO backends): left out whole,
#: since they describe the weights the folder had, not the graph written now.
_LEFT_OUT_FOLDERS = ("onnx", "openvino")


def export_onnx_folder(folder: str | os.PathLike, out_dir: str | os.PathLike, *, phm: str = "premixed",
                       opset: int = 17) -> ExportResult:
    """Write ``out_dir``, a new folder that sentence-transformers' ONNX backend loads
    (``SentenceTransformer(out_dir, backend="onnx")``), from the SentenceTransformer folder ``folder``.

    ``folder`` is a :func:`~hyperplex.convert.save_converted` folder of a ``SentenceTransformer`` (a
    ``hyperplex compress`` model's ``student/``) or a plain SentenceTransformer folder (e.g. the teacher's). The
    new folder holds ``onnx/model.onnx`` — the transformer's ``input_ids``, ``attention_mask`` →
    ``last_hidden_state`` graph of :func:`export_onnx` (``sentence_embedding=False``), with the factors, not
    ``H`` — under the transformer module's path, beside every other file of ``folder`` except weights
    (``*.safetensors``, ``*.bin``, …), earlier ``onnx/`` and ``openvino/`` exports and ``hyperplex_convert.json``:
    the tokenizer, ``config.json``, the pooling and normalisation modules. ``modules.json`` names each module by
    its ``sentence_transformers.models.<Class>`` alias where the installed sentence-transformers has one
    (sentence-transformers 6 writes paths that 5 cannot import; the aliases resolve in both). Only the first
    module may have parameters: the graph covers the transformer, the later modules (pooling, normalisation) run
    from their config files.

    Built in a temporary folder beside ``out_dir`` and renamed into place once the graph has been checked in
    onnxruntime, so an error leaves nothing behind. Raises :class:`ExportError` (``out_dir`` exists, its parent
    does not, ``folder`` is not a SentenceTransformer folder, a later module has parameters, a symbolic link in
    ``folder``) or the errors of loading ``folder`` and of :func:`export_onnx`.
    """
    import json
    import shutil
    from pathlib import Path

    from hyperplex.convert.serialize import SPEC_NAME, load_converted
    from hyperplex.fileio import UnsafePathError, check_folder_files, inside, read_bounded

    source, out = Path(folder), Path(out_dir)
    _check_phm_mode(phm)  # before the model is loaded
    if os.path.lexists(out):
        raise ExportError(f"{out}: already exists; give a new folder (nothing is overwritten)")
    if not out.absolute().parent.is_dir():
        raise ExportError(f"{out}: folder {out.absolute().parent} does not exist")
    modules_path = source / "modules.json"
    if not source.is_dir() or not modules_path.is_file():
        raise ExportError(f"{source}: not a SentenceTransformer folder (no modules.json); an ONNX folder for "
                          f"sentence-transformers is written from one")
    try:  # a FIFO or a device would block the copy or be left out of it; refused before anything is loaded
        check_folder_files(source)
    except UnsafePathError as err:
        raise ExportError(str(err)) from err
    try:
        modules = json.loads(read_bounded(modules_path, 1 << 20))
    except UnsafePathError as err:
        raise ExportError(str(err)) from err
    except ValueError as err:
        raise ExportError(f"{modules_path}: not valid JSON ({err})") from err
    if (not isinstance(modules, list) or not modules
            or not all(isinstance(m, dict) and isinstance(m.get("path"), str) and isinstance(m.get("type"), str)
                       for m in modules)):
        raise ExportError(f"{modules_path}: expected a non-empty list of modules, each with a 'path' and a 'type'")
    try:
        transformer_dir = inside(source, modules[0]["path"] or ".", f"{modules_path}: modules[0].path")
    except UnsafePathError as err:
        raise ExportError(str(err)) from err
    if (source / SPEC_NAME).is_file():
        model = load_converted(source)
    else:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(os.fspath(source), device="cpu")
    if not _is_sentence_transformer(model):
        raise ExportError(f"{source}: holds a {type(model).__name__}, not a SentenceTransformer")
    for index, module in enumerate(list(model.children())[1:], start=1):
        if any(True for _ in module.parameters()):
            raise ExportError(f"{source}: module {index} ({type(module).__name__}) has parameters; the ONNX folder's "
                              f"graph covers the transformer (module 0) only — export the sentence_embedding graph "
                              f"with export_onnx instead")
    tmp = Path(temporary_sibling(out))
    try:
        os.mkdir(tmp)
        _copy_without_weights(source, tmp)
        portable = [{**m, "type": _portable_module_type(m["type"])} for m in modules]
        (tmp / "modules.json").write_text(json.dumps(portable, indent=2) + "\n", encoding="utf-8")
        relative = Path(transformer_dir).resolve().relative_to(source.resolve())
        onnx_dir = tmp / relative / "onnx"
        onnx_dir.mkdir(parents=True, exist_ok=True)
        result = export_onnx(model, onnx_dir / "model.onnx", sentence_embedding=False, phm=phm, opset=opset)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    final = out / relative / "onnx" / "model.onnx"
    return ExportResult(os.fspath(final), final.stat().st_size, result.input_names, result.output_names,
                        result.max_abs_diff)


def _copy_without_weights(source, target) -> None:
    """Copy ``source``'s files into the existing folder ``target``, leaving out weights
    (:data:`_LEFT_OUT_SUFFIXES`), other backends' folders (:data:`_LEFT_OUT_FOLDERS`), ``hyperplex_convert.json`` and
    hidden entries; a symbolic link or any other entry that is not a regular file or folder is refused."""
    import shutil

    from hyperplex.convert.serialize import SPEC_NAME

    for entry in sorted(os.scandir(source), key=lambda e: e.name):
        if entry.name.startswith(".") or entry.name == SPEC_NAME:
            continue
        if entry.is_symlink():
            raise ExportError(f"{entry.path}: a symbolic link; an ONNX folder is copied from regular files only")
        if entry.is_dir():
            if entry.name in _LEFT_OUT_FOLDERS:
                continue
            os.mkdir(os.path.join(target, entry.name))
            _copy_without_weights(entry.path, os.path.join(target, entry.name))
        elif not entry.is_file():  # check_folder_files refused these already: reached only if the folder changed since
            raise ExportError(f"{entry.path}: not a regular file; an ONNX folder is copied from regular files only")
        elif not entry.name.endswith(_LEFT_OUT_SUFFIXES):
            shutil.copyfile(entry.path, os.path.join(target, entry.name))


def _portable_module_type(name: str) -> str:
    """``sentence_transformers.models.<Class>`` for a sentence-transformers module class that the installed
    version also exports under that alias (resolved by sentence-transformers 3 to 6), else ``name`` unchanged.
    Only ``sentence_transformers.*`` names are imported."""
    import importlib

    module_path, _, cls = name.rpartition(".")
    if not module_path.startswith("sentence_transformers"):
        return name
    try:
        original = getattr(importlib.import_module(module_path), cls)
        with warnings.catch_warnings():  # sentence-transformers 6 deprecates the alias module it still resolves
            warnings.simplefilter("ignore", DeprecationWarning)
            legacy = importlib.import_module("sentence_transformers.models")
    except (ImportError, AttributeError):
        return name
    return f"sentence_transformers.models.{cls}" if getattr(legacy, cls, None) is original else name
