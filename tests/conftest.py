import os
from pathlib import Path

import pytest
import torch

# Without a GPU the Triton kernel's tests run under Triton's interpreter. Triton decides at each @triton.jit whether
# it interprets, so the switch must be on before anything (torch, peft, a test module) imports and decorates with it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Two CPU cores in CI: keep torch from oversubscribing them.
torch.set_num_threads(min(2, os.cpu_count() or 1))

# The suite must not depend on whether `hyperplex native` installed the compiled PHM kernel on this machine (with
# HYPERPLEX_NATIVE unset, `auto` layers would take it): off unless a test turns it on itself
# (tests/layers/test_native.py installs it only into a private copy of the cache, the `kernel_cache` fixture).
os.environ["HYPERPLEX_NATIVE"] = "0"

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")

# ---------------------------------------------------------------------------- the two tiers
# `pytest` runs the fast tier: unit tests, in this process, on what the clone holds. `pytest -m integration` runs the
# rest: what starts processes (the CLI in a child, DDP, a killed writer), compiles (the native C++ kernel), or loads
# a pretrained model or the shared data. A test joins the integration tier by any of the rules below, so that test
# files need no marks of their own; `slow` stays a separate opt-in (run only where `-m` names it).

#: Files (relative to the repository root) whose tests all start processes or compile.
INTEGRATION_MODULES = {
    "tests/cli/test_cli_robustness_training.py",  # `hyperplex train` in a child, killed and resumed
    "tests/cli/test_model_folder_safety.py",  # lock holders in other processes
    "tests/experiments/test_cli.py",  # the plan runner as a script
    "tests/experiments/test_demo.py",  # `hyperplex demo` in a child
    "tests/experiments/test_lanes.py",  # lane.sh in bash, with a stand-in interpreter
    "tests/experiments/test_retrain.py",  # lanes.sh in bash
    "tests/layers/test_native.py",  # builds the C++ kernel
    "tests/test_typing.py",  # mypy over the package, the scripts and torch's annotations (~2 min)
}
#: Single tests, in files otherwise fast (node ids without parameters).
INTEGRATION_TESTS = {
    "tests/layers/test_phm.py::test_torch_compile_fullgraph",  # inductor compiles C++ in worker processes
    "tests/train/test_trainer.py::test_compiled_training_follows_the_eager_run_and_saves_the_same_checkpoint",  # same
    "tests/scoring/test_plan_metrics.py::test_bench_compress_counts_match_the_models",  # a process per model
    # DDP under torchrun (the file's other tests are unit tests)
    "tests/train/test_process.py::test_shutdown_joins_gloo_threads_after_ddp",
    "tests/train/test_process.py::test_the_group_train_made_is_destroyed_at_exit_and_a_callers_group_is_left_alone",
    # converge.sh in a child (bash, then Python for its checks and collect.py)
    "tests/experiments/test_gpu_converge.py::test_converge_refuses_bad_arguments_before_training",
    "tests/experiments/test_gpu_converge.py::test_converge_trains_no_model_that_is_already_recorded",
    "tests/experiments/test_gpu_converge.py::test_converge_does_not_train_again_a_model_finished_in_an_earlier_call_but_reports_it",
    "tests/experiments/test_gpu_converge.py::test_a_model_whose_compilation_fails_trains_again_without_it",
    "tests/experiments/test_gpu_converge.py::test_parallel_starts_the_next_model_when_one_ends",
    "tests/experiments/test_gpu_converge.py::test_a_second_call_resumes_a_model_the_first_stopped_at_its_budget",
    "tests/experiments/test_gpu_converge.py::test_a_carried_compile_cache_spares_the_next_call_the_compilation",
    "tests/experiments/test_gpu_converge.py::test_check_validates_the_models_and_the_plan_and_trains_nothing",
}
#: Folders whose tests are all integration tests, less :data:`FAST_IN_INTEGRATION_FOLDERS`.
INTEGRATION_FOLDERS = ("tests/benchmarks/",)  # they run the benchmark scripts (worker processes, real models)
# the harness's statistics on given timings; the GPU kernel step's summary table from given points
FAST_IN_INTEGRATION_FOLDERS = {"tests/benchmarks/test_harness.py", "tests/benchmarks/test_gpu_kernel_summary.py"}
#: Fixtures that build the native kernel, load a pretrained model, or read the data outside the clone.
INTEGRATION_FIXTURES = {"kernel_cache", "kernel", "minilm", "shared_data"}
#: Names whose use in a test's own body means it starts a process.
PROCESS_NAMES = {"subprocess", "torchrun", "Popen"}


def is_integration(item, root: Path) -> bool:
    """Whether a collected test belongs to the integration tier (the rules above)."""
    try:
        module = item.path.relative_to(root).as_posix()
    except ValueError:  # a test file outside the repository (pytest given an absolute path elsewhere)
        module = item.path.as_posix()
    if module in INTEGRATION_MODULES or (module.startswith(INTEGRATION_FOLDERS)
                                         and module not in FAST_IN_INTEGRATION_FOLDERS):
        return True
    if f"{module}::{getattr(item, 'originalname', item.name)}" in INTEGRATION_TESTS:
        return True
    if INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    code = getattr(getattr(item, "function", None), "__code__", None)
    return code is not None and bool(PROCESS_NAMES & set(code.co_names))


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection, which reads the marks
def pytest_collection_modifyitems(config, items):
    root = config.rootpath
    for item in items:
        if is_integration(item, root):
            item.add_marker(pytest.mark.integration)
    if "slow" not in (config.option.markexpr or ""):
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_python(request, monkeypatch):
    """In the fast tier, starting a Python child fails at once with the rule to follow (a guard: a test that does so
    unmarked would make the fast tier slow and the tiers wrong)."""
    if request.node.get_closest_marker("integration"):
        return
    import subprocess
    import sys

    class Guarded(subprocess.Popen):
        def __new__(cls, args, *rest, **kwargs):  # before any of Popen's state exists
            first = os.fsdecode(args if isinstance(args, (str, bytes, os.PathLike)) else next(iter(args), ""))
            program = first.split(" ")[0]  # a shell command line's program
            if program == sys.executable or os.path.basename(program).startswith("python"):
                raise RuntimeError(f"{request.node.nodeid} starts a Python process ({program}): the fast tier "
                                   "starts none. Add the test to INTEGRATION_TESTS (or its file to "
                                   "INTEGRATION_MODULES) in tests/conftest.py, or name subprocess/torchrun in the "
                                   "test's body.")
            return super().__new__(cls)

    monkeypatch.setattr(subprocess, "Popen", Guarded)


@pytest.fixture
def shared_data():
    """Path to ../shared/data; skips the test when it is absent."""
    path = os.environ.get("HYPERPLEX_DATA", SHARED_DATA)
    if not os.path.isdir(path):
        pytest.skip(f"shared data folder not found at {path}")
    return path


#: Environment for a child ``python``: this checkout's ``src`` first on the path, one OpenMP thread.
SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1",
                  "PYTHONPATH": os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src")) + os.pathsep
                  + os.environ.get("PYTHONPATH", "")}


def torchrun(*args, timeout=300):
    """``python -m torch.distributed.run`` with 2 gloo processes on this machine, output captured.
    ``--standalone``: the rendezvous picks a free local port (a fixed port fails when something else holds it)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           *map(str, args)], env={**SUBPROCESS_ENV, "HYPERPLEX_BACKEND": "gloo"},
                          capture_output=True, text=True, timeout=timeout)


def write_tiny_config(directory, **training):
    """A seconds-long arithmetic run with a tiny PHM Transformer (generated data, no files)."""
    from pathlib import Path

    import yaml

    cfg = {
        "name": "tiny", "seed": 3,
        "data": {"task": "translation", "format": "arithmetic", "arithmetic_train_size": 256,
                 "arithmetic_dev_size": 16, "tokenizer": "char", "shared_vocab": True},
        "model": {"architecture": "transformer", "d_model": 16, "num_heads": 2, "d_ff": 32, "encoder_layers": 1,
                  "decoder_layers": 1, "dropout": 0.1, "linear": {"kind": "phm", "n": 2}},
        "training": {"lr": 3e-3, "batch_size": 32, "max_steps": 24, "validation_every": 12, "log_every": 1,
                     "num_threads": 1, "progress_bar": False, "plots": False, **training},
        "testing": {"beam_size": 1, "max_output_length": 8, "batch_size": 16},
    }
    path = Path(directory) / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def tiny_config(tmp_path):
    """Factory: ``tiny_config(**training_overrides)`` → path of a tiny training config in tmp_path."""
    return lambda **training: write_tiny_config(tmp_path, **training)


#: The words of the tiny BERT vocabulary used by the pretrained-model tests.
TINY_BERT_WORDS = "the a cat dog sat on mat big small red blue runs fast slow and is very good bad film".split()


def write_tiny_bert(folder, layers: int = 2) -> None:
    """A tiny random BERT (hidden 32, FFN 64, ``layers`` layers, seed 0) and its word-level tokenizer in
    ``folder`` (needs transformers; callers skip without it)."""
    import os

    import torch
    import transformers

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *TINY_BERT_WORDS]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=layers,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=32)
    transformers.BertModel(config).save_pretrained(folder)
    transformers.BertTokenizerFast(os.fspath(folder / "vocab.txt")).save_pretrained(folder)


def write_tiny_sentence_transformer(folder, bert_folder, normalize: bool = True) -> None:
    """A SentenceTransformer folder: the tiny BERT in ``bert_folder`` (:func:`write_tiny_bert`, at most 24
    tokens) + mean pooling (+ Normalize), saved to ``folder`` (needs sentence-transformers)."""
    import os

    import sentence_transformers
    try:  # sentence-transformers 6 moved the modules; 3-5 have them in .models
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Normalize, Pooling, Transformer
    modules = [Transformer(os.fspath(bert_folder), max_seq_length=24), Pooling(32, "mean")]
    sentence_transformers.SentenceTransformer(modules=modules + ([Normalize()] if normalize else []),
                                              device="cpu").save(os.fspath(folder))


def tiny_sentences(count: int, seed: int, low: int = 3, high: int = 8) -> list[str]:
    """``count`` sentences of ``low``–``high`` words from :data:`TINY_BERT_WORDS`, the same for the same seed."""
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(TINY_BERT_WORDS) for _ in range(rng.randint(low, high))) for _ in range(count)]


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    """A folder holding :func:`write_tiny_bert`'s model and tokenizer."""
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("bert")
    write_tiny_bert(folder)
    return folder


def assert_same_training_state(a, b, step: int) -> None:
    """Two loaded checkpoints (``load_checkpoint``) hold equal model tensors, the same optimizer state and
    both stopped at ``step``: what a resumed run must reproduce bit for bit."""
    import torch

    assert a.model_state.keys() == b.model_state.keys()
    assert all(torch.equal(a.model_state[k], b.model_state[k]) for k in a.model_state)
    assert a.extra["trainer"]["step"] == b.extra["trainer"]["step"] == step
    states_a, states_b = a.optimizer_state["state"], b.optimizer_state["state"]
    assert states_a.keys() == states_b.keys() and all(
        torch.equal(states_a[i][k], states_b[i][k]) for i in states_a for k in states_a[i])


@pytest.fixture(scope="module")
def teacher_folder(tmp_path_factory):
    """A SentenceTransformer folder: tiny random BERT (hidden 32, 2 layers) + mean pooling + Normalize."""
    pytest.importorskip("transformers")
    pytest.importorskip("sentence_transformers")
    bert = tmp_path_factory.mktemp("bert")
    write_tiny_bert(bert)
    folder = tmp_path_factory.mktemp("teacher")
    write_tiny_sentence_transformer(folder, bert)
    return folder


def write_distill_config(tmp_path, teacher, *, kind="phm", n=2, steps=200, extra=None, task="distillation"):
    """A tiny distillation config in ``tmp_path`` (30 training and 10 dev sentences of :func:`tiny_sentences`,
    a student of ``teacher``); ``extra``: ``{"section.key": value}``. Returns the YAML's path."""
    import yaml

    (tmp_path / "train.txt").write_text("\n".join(tiny_sentences(30, 1)) + "\n")
    (tmp_path / "dev.txt").write_text("\n".join(tiny_sentences(10, 2)) + "\n")
    raw = {"name": "tiny_distill", "seed": 3, "model_dir": str(tmp_path / "m"),
           "data": {"task": task, "train": str(tmp_path / "train.txt"), "dev": str(tmp_path / "dev.txt")},
           "model": {"architecture": "pretrained_student", "path": str(teacher), "kind": kind, "n": n,
                     "min_features": 8},
           "training": {"lr": 3e-3, "batch_size": 8, "max_steps": steps, "validation_every": steps,
                        "log_every": 50, "num_threads": 1, "progress_bar": False, "plots": False, "device": "cpu"}}
    for key, value in (extra or {}).items():
        section, name = key.split(".")
        raw[section][name] = value
    path = tmp_path / "distill.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def prepared_task(path):
    """(config, task) of a config file, its data prepared from scratch with the config's seed."""
    from hyperplex.config.experiment import load_experiment
    from hyperplex.tasks import build_task

    cfg = load_experiment(path)
    task = build_task(cfg, cfg.model_dir, None)
    torch.manual_seed(cfg.seed)
    task.prepare(fresh=True)
    return cfg, task


def load_benchmark(name: str):
    """The script ``benchmarks/NAME.py`` (a headline benchmark) or ``benchmarks/probes/NAME.py`` imported as a module
    (benchmarks are scripts, not a package)."""
    import importlib.util
    import sys

    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    path = folder / f"{name}.py"
    if not path.is_file():
        path = folder / "probes" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def without_compiler(monkeypatch):
    """hyperplex.layers.native with no kernel loaded or cached and no C++ compiler or ninja to build one."""
    import shutil

    from hyperplex.layers import native

    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_load_cached", lambda name: None)
    monkeypatch.setattr(native, "_env_failure", None)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    monkeypatch.setattr(native, "_ninja_from_pip", lambda: False)


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    """A private ``TORCH_EXTENSIONS_DIR`` holding a copy of this machine's build of the native PHM kernel (built
    first if needed; skips where it cannot be), ``HYPERPLEX_NATIVE`` unset and the module's per-process state
    reset, so that installing the kernel in a test never touches the user's cache. Returns the build's folder."""
    import shutil

    from hyperplex.layers import native

    try:
        library = Path(native.build_native_kernels())
    except Exception as err:  # no compiler or ninja here; test_native covers the error
        pytest.skip(f"native kernel not buildable here: {err}")
    folder = tmp_path / "torch_extensions" / native._library_name()
    folder.mkdir(parents=True)
    shutil.copy2(library, folder / library.name)
    if (library.parent / native.BUILD_MARKER).is_file():  # the checksum that lets the copy be loaded
        shutil.copy2(library.parent / native.BUILD_MARKER, folder / native.BUILD_MARKER)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(folder.parent))
    monkeypatch.delenv(native.ENV_VAR, raising=False)
    for attr in ("_module", "_enabled", "_installed", "_env_failure"):
        monkeypatch.setattr(native, attr, None)
    return folder


def disk_state(folder) -> dict[str, str]:
    """{relative path: SHA-256} of every file under ``folder``: what a test compares before and after an error to
    show that nothing on disk changed."""
    import hashlib

    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                found[os.path.relpath(path, folder)] = hashlib.sha256(handle.read()).hexdigest()
    return found
