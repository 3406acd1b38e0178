"""Export a saved model as ONNX, the library side of ``hyperplex export MODEL OUT.onnx``.

:func:`export` takes MODEL, one of

* a folder :func:`~hyperplex.convert.save_converted` wrote (``hyperplex_convert.json``), or a
  ``hyperplex compress`` model folder (its ``student/``): a ``SentenceTransformer`` is written as
  ``input_ids``, ``attention_mask`` → ``sentence_embedding`` (``--token-embeddings``: its transformer's
  ``last_hidden_state``), a ``transformers`` model as ``input_ids``, ``attention_mask`` → its first output;
* a ``hyperplex train`` model folder or checkpoint whose model is a ``TransformerClassifier``:
  ``tokens`` ``(B, T)``, ``lengths`` ``(B,)`` → ``logits`` ``(B, C)``.

Other hyperplex models (translators, whose output comes from a search loop; the LSTM and pair
classifiers) are refused with a message naming the model; int8 folders (``save_quantized``) are
refused naming the first int8 layer. Nothing is written on any error.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

#: hyperplex's own models that ``hyperplex export`` writes, with their example inputs' builder.
SUPPORTED_MODELS = ("TransformerClassifier",)


def classifier_inputs(model, rows: int = 2, length: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Example ``tokens`` ``(rows, length)`` and ``lengths`` ``(rows,)`` for a ``TransformerClassifier``
    (the last row padded after ``length − 3`` tokens)."""
    embedding = next(m for m in model.modules() if isinstance(m, torch.nn.Embedding))
    generator = torch.Generator().manual_seed(rows)
    tokens = torch.randint(0, embedding.num_embeddings, (rows, length), generator=generator)
    tokens[tokens == model.pad_index] = (model.pad_index + 1) % embedding.num_embeddings
    lengths = torch.full((rows,), length)
    lengths[-1] = length - 3
    tokens[-1, length - 3:] = model.pad_index
    return tokens, lengths


def _converted_folder(model_path: Path) -> Path:
    """MODEL itself, or the ``student/`` of a ``hyperplex compress`` model folder that holds no converted model of
    its own."""
    from hyperplex.convert.serialize import SPEC_NAME

    student = model_path / "student"
    if model_path.is_dir() and not (model_path / SPEC_NAME).is_file() and (student / SPEC_NAME).is_file():
        return student
    return model_path


def load_exportable(model_path: Path, checkpoint: str = "best", data_root: str | None = None):
    """(model, keyword arguments for :func:`~hyperplex.convert.onnx.export_onnx`) for MODEL (a converted or
    compress folder, or a ``hyperplex train`` model folder / checkpoint); ExportError for what cannot be exported."""
    from hyperplex.convert.onnx import ExportError, unsupported_layers
    from hyperplex.convert.serialize import SPEC_NAME
    from hyperplex.int8 import QUANT_SPEC_NAME, is_quantized, load_model_folder

    folder = _converted_folder(model_path)
    if folder.is_dir() and ((folder / QUANT_SPEC_NAME).is_file() or (folder / SPEC_NAME).is_file()):
        model = load_model_folder(folder)  # checks the folder
        if is_quantized(model):  # refused, naming its first int8 layer
            name, reason = unsupported_layers(model)[0]
            raise ExportError(f"cannot export {folder}: layer {name!r}: {reason} (the folder holds an int8 model; "
                              f"export the float folder it was quantised from)")
        return model, {}
    from hyperplex.inference.load import load_model

    _, _, model = load_model(model_path, checkpoint, data_root, read_data=False)
    model = model.cpu().eval()
    name = type(model).__name__
    if name not in SUPPORTED_MODELS:
        raise ExportError(f"{model_path}: hyperplex export writes {', '.join(SUPPORTED_MODELS)} among hyperplex's own "
                          f"models; this model is a {name} (not supported)")
    return model, {"example_inputs": classifier_inputs(model), "check_inputs": classifier_inputs(model, 3, 11),
                   "input_names": ["tokens", "lengths"], "output_names": ["logits"]}


def export(model: str, output: str, checkpoint: str = "best", token_embeddings: bool = False, opset: int = 17,
           data_root: str | None = None, phm: str = "premixed", st_folder: bool = False):
    """Export MODEL to OUTPUT (see the module notes): ``(ExportResult, bytes of the model's tensors)``; nothing
    is written on any error. ``st_folder``: OUTPUT is a new folder that sentence-transformers' ONNX backend
    loads (:func:`~hyperplex.convert.onnx.export_onnx_folder`; MODEL a SentenceTransformer folder), and the
    second value is ``None``."""
    from hyperplex.convert.onnx import ExportError, export_onnx, export_onnx_folder
    from hyperplex.int8 import model_bytes

    model_path = Path(model)
    if not model_path.exists():
        raise FileNotFoundError(f"model not found: {model}")
    if st_folder:
        if token_embeddings:
            raise ExportError("--st-folder always writes the token-embedding graph; leave out --token-embeddings")
        return export_onnx_folder(_converted_folder(model_path), output, phm=phm, opset=opset), None
    out = Path(output)
    if out.suffix != ".onnx":
        raise ExportError(f"{output}: the output file must end in .onnx")
    if not out.parent.is_dir() and str(out.parent):
        raise ExportError(f"{output}: folder {out.parent} does not exist")
    loaded, kwargs = load_exportable(model_path, checkpoint, data_root)
    result = export_onnx(loaded, os.fspath(out), sentence_embedding=not token_embeddings, phm=phm, opset=opset,
                         **kwargs)
    return result, model_bytes(loaded)
