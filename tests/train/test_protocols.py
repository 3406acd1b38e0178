"""The optional hooks of hyperplex.train.protocols: the classes that implement each one still match it, a
model or task without a hook is handled as it always is without the feature, and one with it is called."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
import yaml
from torch import nn

from hyperplex.config import ConfigError
from hyperplex.config.experiment import load_experiment
from hyperplex.config.registry import ARCHITECTURES, Architecture
from hyperplex.models.classifiers import DecomposableAttention, NLIEncoderClassifier, QuaternionAttentionModel
from hyperplex.models.pretrained_classifier import PretrainedClassifier, PretrainedTokenizer
from hyperplex.models.pretrained_student import PretrainedStudent
from hyperplex.models.transformer import TransformerClassifier, TransformerConfig  # noqa: F401 (registry loads it)
from hyperplex.tasks import task_class
from hyperplex.tasks.classification import ClassificationTask, PairClassificationTask, RankingTask
from hyperplex.tasks.distillation import DistillationTask
from hyperplex.tasks.translation import TranslationTask
from hyperplex.train.checkpoint import CheckpointError
from hyperplex.train.checkpoint.format import load_into, model_state
from hyperplex.train.protocols import (
    CustomCheckpointState,
    Describes,
    EvaluatesFiles,
    FitsWhenBuilt,
    OwnTokenizer,
    PairTextTokenizer,
    PretrainedEmbeddings,
    SignsMetrics,
    Translates,
)
from hyperplex.train.task import Task


# ---------------------------------------------------------------------------- who implements what
def test_the_implementing_classes_match_their_protocols():
    assert issubclass(PretrainedClassifier, OwnTokenizer) and issubclass(PretrainedClassifier, CustomCheckpointState)
    assert issubclass(PretrainedClassifier, Describes)
    assert issubclass(PretrainedStudent, FitsWhenBuilt)
    assert all(issubclass(c, PretrainedEmbeddings)
               for c in (NLIEncoderClassifier, DecomposableAttention, QuaternionAttentionModel))
    assert all(issubclass(c, EvaluatesFiles)
               for c in (ClassificationTask, PairClassificationTask, RankingTask, TranslationTask))
    assert issubclass(TranslationTask, Translates)
    assert hasattr(PretrainedTokenizer, "encode_pair_batch")  # PairTextTokenizer (pad_index is set per instance)


def test_models_and_tasks_without_the_hooks_do_not_match():
    for hook in (OwnTokenizer, FitsWhenBuilt, CustomCheckpointState, Describes, PretrainedEmbeddings):
        assert not issubclass(TransformerClassifier, hook), hook
    assert not issubclass(DistillationTask, EvaluatesFiles) and not issubclass(DistillationTask, Translates)
    assert not issubclass(ClassificationTask, Translates)


def test_registered_tasks_are_one_class_per_task_kind():
    assert [task_class(t) for t in ("classification", "pair_classification", "ranking")] == \
        [ClassificationTask, PairClassificationTask, RankingTask]
    assert [c.name for c in (ClassificationTask, PairClassificationTask, RankingTask)] == \
        ["classification", "pair_classification", "ranking"]


# ---------------------------------------------------------------------------- checkpoint state
class HalfSaved(nn.Module):
    """Saves only ``kept``; loading records what it was given, and refuses a marked state."""

    def __init__(self) -> None:
        super().__init__()
        self.kept, self.frozen = nn.Linear(2, 2), nn.Linear(2, 2)
        self.loaded: list[dict] = []

    def checkpoint_state_dict(self) -> dict[str, torch.Tensor]:
        return {f"kept.{k}": v for k, v in self.kept.state_dict().items()}

    def load_checkpoint_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if float(state["kept.bias"][0]) == 99.0:
            raise ValueError("trained on another base")
        self.loaded.append(state)


def test_a_model_without_the_checkpoint_hook_saves_and_loads_its_state_dict(tmp_path):
    model, other = nn.Linear(3, 2), nn.Linear(3, 2)
    state = model_state(model)
    assert not isinstance(model, CustomCheckpointState) and state.keys() == model.state_dict().keys()
    load_into(other, state, tmp_path / "x.safetensors")
    assert torch.equal(other.weight, model.weight)


def test_a_model_with_the_checkpoint_hook_is_saved_and_loaded_through_it(tmp_path):
    model = HalfSaved()
    state = model_state(model)
    assert isinstance(model, CustomCheckpointState) and set(state) == {"kept.weight", "kept.bias"}
    load_into(model, state, tmp_path / "x.safetensors")
    assert model.loaded == [state]
    with pytest.raises(CheckpointError, match="x.safetensors: trained on another base"):
        load_into(model, {**state, "kept.bias": torch.full((2,), 99.0)}, tmp_path / "x.safetensors")


# ---------------------------------------------------------------------------- the classification task's hooks
class WordIds:
    """A model's own tokenizer: one id per distinct word, 1 = padding; joins a pair with id 2 when ``pairs``."""

    pad_index = 1

    def __init__(self, config=None) -> None:
        self.ids: dict[str, int] = {}

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[self.ids.setdefault(w, len(self.ids) + 3) for w in t.split()] for t in texts]

    def __len__(self) -> int:
        return 40

    def describe(self) -> str:
        return "word ids"


class WordPairIds(WordIds):
    def encode_pair_batch(self, first: list[str], second: list[str]):
        return [a + [2] + b for a, b in zip(self.encode_batch(first), self.encode_batch(second))], None


class DescribedClassifier(TransformerClassifier):
    def describe(self) -> str:
        return "described: every weight trains"


class OwnWordsClassifier(TransformerClassifier):
    @classmethod
    def text_tokenizer(cls, config) -> WordIds:
        return WordIds(config)


class OwnWordPairsClassifier(TransformerClassifier):
    @classmethod
    def text_tokenizer(cls, config) -> WordIds:
        return WordPairIds(config)


class EmbeddingsClassifier(TransformerClassifier):
    calls: list[tuple] = []  # (vectors shape, words found) of each load

    def load_pretrained_embeddings(self, vectors, mask=None) -> None:
        self.calls.append((tuple(vectors.shape), int(mask.sum())))


def classification_task(tmp_path, monkeypatch, model_class: type, task: str = "classification", **data) -> Task:
    """A prepared task of ``task`` on 8 generated rows whose architecture's model class is ``model_class``
    (``data``: more keys of the data section)."""
    monkeypatch.setitem(ARCHITECTURES, "toy", Architecture(__name__, "TransformerConfig", model_class.__name__,
                                                           "cross_encoder", "a test model"))
    rows = [(f"the cat {'sits' if i % 2 else 'runs'} here", f"a dog {i}", str(i % 2), f"q{i // 2}") for i in range(8)]
    (tmp_path / "train.tsv").write_text("text\tb\tlabel\tgroup\n" + "".join("\t".join(r) + "\n" for r in rows))
    data = {"task": task, "format": "tsv", "train": str(tmp_path / "train.tsv"), "dev": str(tmp_path / "train.tsv"),
            "tokenizer": "word", "text_field": "text", "a_field": "text", "b_field": "b", "group_field": "group",
            **data}
    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump({"name": "toy", "data": data, "training": {"max_steps": 1}, "model": {
        "architecture": "toy", "d_model": 8, "num_heads": 1, "d_ff": 8, "encoder_layers": 1, "decoder_layers": 0}}))
    cfg = load_experiment(config, model_dir=str(tmp_path / "m"))
    (tmp_path / "m").mkdir()
    prepared = task_class(task)(cfg, tmp_path / "m", None, logging.getLogger("hyperplex.test_protocols"))
    prepared.prepare(fresh=True)
    return prepared


def test_a_model_without_describe_adds_no_log_line(tmp_path, monkeypatch, caplog):
    task = classification_task(tmp_path, monkeypatch, TransformerClassifier)
    with caplog.at_level(logging.INFO, "hyperplex.test_protocols"):
        task.build_model()
    assert not [r for r in caplog.records if "described" in r.getMessage()]


def test_a_model_with_describe_is_described_in_the_log(tmp_path, monkeypatch, caplog):
    task = classification_task(tmp_path, monkeypatch, DescribedClassifier)
    with caplog.at_level(logging.INFO, "hyperplex.test_protocols"):
        task.build_model()
    assert "described: every weight trains" in [r.getMessage() for r in caplog.records]


def test_without_its_own_tokenizer_the_task_builds_and_saves_a_vocabulary(tmp_path, monkeypatch):
    task = classification_task(tmp_path, monkeypatch, TransformerClassifier)
    assert {p.name for p in (tmp_path / "m").iterdir()} == {"text.json", "text_vocab.json"}
    assert task.metadata()["files"] == {"text": {"tokenizer": "text.json", "vocabulary": "text_vocab.json"}}


def test_a_model_class_with_its_own_tokenizer_encodes_the_text(tmp_path, monkeypatch):
    task = classification_task(tmp_path, monkeypatch, OwnWordsClassifier)
    assert [list(t) for t in task.train_set.token_ids[:2]] == [[3, 4, 5, 6], [3, 4, 7, 6]]
    assert list((tmp_path / "m").iterdir()) == []  # nothing saved: rebuilt from the model config
    assert task.metadata() == {"vocab_size": 40, "labels": ["0", "1"], "tokenizer": "model"}
    assert task.build_model().embed.token.num_embeddings == 40


def test_a_pair_task_joins_pairs_with_a_tokenizer_that_can(tmp_path, monkeypatch):
    task = classification_task(tmp_path, monkeypatch, OwnWordPairsClassifier, "ranking")
    assert isinstance(task.text.tokenizer, PairTextTokenizer) and task.joint_pairs
    assert list(task.train_set.token_ids[0]) == [3, 4, 5, 6, 2, 8, 9, 10]
    assert task.train_set.groups.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_a_pair_task_refuses_a_tokenizer_that_cannot_join_pairs(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="'toy' brings its own tokenizer, which cannot encode text pairs"):
        classification_task(tmp_path, monkeypatch, OwnWordsClassifier, "pair_classification")


def test_pretrained_embeddings_need_the_hook(tmp_path, monkeypatch):
    task = classification_task(tmp_path, monkeypatch, TransformerClassifier, embeddings="vectors.txt")
    with pytest.raises(ValueError, match="model 'toy' cannot load pre-trained embeddings"):
        task.build_model()


def test_a_model_with_the_embeddings_hook_gets_the_vectors(tmp_path, monkeypatch):
    (tmp_path / "vectors.txt").write_text("cat 1 2 3 4 5 6 7 8\nsits 8 7 6 5 4 3 2 1\nzebra 0 0 0 0 0 0 0 0\n")
    task = classification_task(tmp_path, monkeypatch, EmbeddingsClassifier, embeddings=str(tmp_path / "vectors.txt"))
    monkeypatch.setattr(EmbeddingsClassifier, "calls", [])
    task.build_model()
    assert EmbeddingsClassifier.calls == [((len(task.text), 8), 2)]  # cat and sits are words of the texts, zebra not


# ---------------------------------------------------------------------------- task defaults
class Counting(Task):
    """A task with no hooks of its own: it records how it was prepared."""

    def prepare(self, fresh: bool) -> None:
        self.prepared = fresh


def test_a_task_without_its_own_load_vocabularies_reads_its_data(tmp_path):
    task = Counting(None, tmp_path, None)
    assert task.checkpoint_record is None
    task.load_vocabularies()
    assert task.prepared is False
    assert not isinstance(task, EvaluatesFiles) and not isinstance(task, SignsMetrics)


# ---------------------------------------------------------------------------- hyperplex params
class Fitted(TransformerClassifier):
    """A model class whose constructor would fit to data: ``params`` must build it without the fit."""

    built: list[str] = []

    def __init__(self, *args, fit: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.built.append("fitted" if fit else "without fit")

    @classmethod
    def build_without_fit(cls, config, vocab_size: int, num_outputs: int) -> Fitted:
        return cls(config, vocab_size, num_outputs, fit=False)


class OwnWordsDescribed(OwnWordsClassifier, DescribedClassifier):
    pass


def params_of(tmp_path, monkeypatch, model_class: type) -> str:
    from hyperplex.inference.parameters import params

    monkeypatch.setitem(ARCHITECTURES, "toy", Architecture(__name__, "TransformerConfig", model_class.__name__,
                                                           "cross_encoder", "a test model"))
    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump({"name": "toy", "data": {"task": "classification", "vocab_size": 30},
                                      "training": {"max_steps": 1}, "model": {
        "architecture": "toy", "d_model": 8, "num_heads": 1, "d_ff": 8, "encoder_layers": 1, "decoder_layers": 0}}))
    return params(str(config))


def test_params_builds_a_model_that_fits_when_built_without_the_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(Fitted, "built", [])
    params_of(tmp_path, monkeypatch, Fitted)
    assert Fitted.built == ["without fit"]


def test_params_uses_the_model_s_own_vocabulary_and_description(tmp_path, monkeypatch):
    plain = params_of(tmp_path, monkeypatch, TransformerClassifier)
    assert plain.startswith("toy: toy (vocabulary 30)") and "described" not in plain
    own = params_of(tmp_path, monkeypatch, OwnWordsDescribed)
    assert own.startswith("toy: toy (vocabulary 40)") and own.endswith("\n\ndescribed: every weight trains")


# ---------------------------------------------------------------------------- hyperplex evaluate / translate
class Scored:
    """A task that records how it was scored."""

    def __init__(self) -> None:
        self.calls: list = []

    def validate(self, model, **kwargs) -> dict[str, float]:
        self.calls.append(("validate", kwargs))
        return {"accuracy": 50.0}


class ScoredFiles(Scored):
    def use_evaluation_file(self, path: str) -> None:
        self.calls.append(("file", path))


class Decoding(ScoredFiles):
    signatures = {"bleu": "nrefs:1|case:mixed"}

    def translate(self, model, lines, beam_size=None, **kwargs):
        return lines, [None] * len(lines)

    def source_tokens(self, lines, warn=True):
        return [line.split() for line in lines]


CFG = SimpleNamespace(data=SimpleNamespace(task="toy"), testing=SimpleNamespace(beam_size=3))


def test_scoring_a_file_needs_the_task_hook():
    from hyperplex.inference.verbs import evaluate_split

    with pytest.raises(ValueError, match="--split test.tsv: a toy model is scored on its validation data only"):
        evaluate_split(CFG, Scored(), None, "test.tsv", False)
    task = ScoredFiles()
    assert evaluate_split(CFG, task, None, "test.tsv", False) == {"accuracy": 50.0}  # no signatures
    assert task.calls == [("file", "test.tsv"), ("validate", {})]


def test_a_decoding_task_is_scored_with_the_evaluation_beam_and_reports_its_signatures():
    from hyperplex.inference.verbs import evaluate_split

    task = Decoding()
    assert isinstance(task, Translates) and isinstance(task, SignsMetrics)
    metrics = evaluate_split(CFG, task, None, "dev", True)
    assert metrics == {"accuracy": 50.0, "bleu_signature": "nrefs:1|case:mixed"}
    assert task.calls == [("validate", {"beam_size": 3, "progress": True})]


def test_translate_refuses_a_task_that_does_not_decode(monkeypatch):
    from hyperplex.inference import verbs as inference

    cfg = SimpleNamespace(data=CFG.data, testing=SimpleNamespace(with_beam_size=lambda beam: CFG.testing))
    monkeypatch.setattr(inference, "load_model", lambda *args, **kwargs: (cfg, Scored(), None))
    with pytest.raises(ValueError, match="folder holds a toy model; translate needs a translation model"):
        inference.translate("folder", input_path="unused.txt")
