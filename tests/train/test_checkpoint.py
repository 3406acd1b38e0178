import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from hyperplex.train.checkpoint import (
    CheckpointError,
    CheckpointManager,
    average_checkpoints,
    capture_rng,
    checkpoint_info,
    load_checkpoint,
    load_model_weights,
    restore_rng,
    save_checkpoint,
    save_model_weights,
)
from hyperplex.train.optim import build_optimizer

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


class Tied(nn.Module):
    """Embedding tied with the output projection (as in a Transformer translator)."""

    def __init__(self, vocab=7, dim=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.hidden = nn.Linear(dim, dim)
        self.drop = nn.Dropout(0.3)
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens):  # (B,) -> (B, V)
        return self.out(self.drop(torch.tanh(self.hidden(self.embed(tokens)))))


def train_steps(model, opt, steps, seed_offset):
    for k in range(steps):
        g = torch.Generator().manual_seed(1000 + seed_offset + k)
        tokens = torch.randint(0, 7, (5,), generator=g)
        loss = nn.functional.cross_entropy(model(tokens), tokens)  # dropout draws from the global RNG
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("name,kwargs", [("adam", {}), ("adamw", {"weight_decay": 0.1}), ("sgd", {"momentum": 0.9})])
def test_resume_is_bitwise_identical(tmp_path, name, kwargs):
    torch.manual_seed(0)
    model = Tied()
    opt = build_optimizer(model.parameters(), name, lr=0.01, **kwargs)
    train_steps(model, opt, 3, 0)
    path = save_checkpoint(tmp_path / "c.safetensors", model.state_dict(), opt.state_dict(), {"step": 3})
    train_steps(model, opt, 4, 3)  # uninterrupted run
    expected = {k: v.clone() for k, v in model.state_dict().items()}

    torch.manual_seed(123)  # scramble RNG and weights: everything must come from the file
    resumed = Tied()
    opt2 = build_optimizer(resumed.parameters(), name, lr=0.5)
    c = load_checkpoint(path)
    resumed.load_state_dict(c.model_state)
    opt2.load_state_dict(c.optimizer_state)
    restore_rng(c.rng_state)
    assert c.extra == {"step": 3}
    train_steps(resumed, opt2, 4, 3)
    for k, v in resumed.state_dict().items():
        assert torch.equal(v, expected[k]), k
    assert resumed.out.weight is resumed.embed.weight


def test_tied_weights_stored_once_and_restored_tied(tmp_path):
    model = Tied()
    path = save_checkpoint(tmp_path / "t.safetensors", model.state_dict(), rng=False)
    with safe_open(path, "pt") as f:
        model_tensors = [k for k in f.keys() if k.startswith("model.")]
    assert sorted(model_tensors) == ["model.embed.weight", "model.hidden.bias", "model.hidden.weight"]
    state = load_checkpoint(path).model_state
    assert set(state) == set(model.state_dict()) and state["out.weight"] is state["embed.weight"]
    assert torch.equal(state["out.weight"], model.out.weight)


def test_overlapping_views_are_copied(tmp_path):
    base = torch.arange(10.0)
    state = {"a": base[:6], "b": base[4:], "c": base.view(2, 5).t()}  # overlapping, non-contiguous
    loaded = load_checkpoint(save_checkpoint(tmp_path / "v.safetensors", state, rng=False)).model_state
    for k in state:
        assert torch.equal(loaded[k], state[k])


def test_extra_roundtrip_exact(tmp_path):
    gen = torch.Generator().manual_seed(5)
    extra = {
        "step": 12, "epoch": 2, "best": float("inf"), "lr": 1e-9, "name": "x", "none": None, "flag": True,
        "pair": (1, (2.5, "a")), "by_int": {3: "three", 0: [1, 2]}, "config": {"model": {"d": 8, "n": 4}},
        "sampler": gen.get_state(), "array": np.arange(6, dtype=np.uint32).reshape(2, 3),
        "__tensor__": "a user key that looks like a tag",
    }
    c = load_checkpoint(save_checkpoint(tmp_path / "e.safetensors", {}, None, extra, rng=False))
    got = c.extra
    assert got["pair"] == (1, (2.5, "a")) and isinstance(got["pair"][1], tuple)
    assert got["by_int"] == {3: "three", 0: [1, 2]} and got["config"] == extra["config"]
    assert got["best"] == float("inf") and got["none"] is None and got["flag"] is True
    assert torch.equal(got["sampler"], extra["sampler"])
    assert got["array"].dtype == np.uint32 and np.array_equal(got["array"], extra["array"])
    assert got["__tensor__"] == extra["__tensor__"]
    assert c.optimizer_state is None and c.rng_state is None and c.kind == "checkpoint"
    info = checkpoint_info(tmp_path / "e.safetensors")
    assert info["extra"]["step"] == 12 and info["extra"]["sampler"] is None and not info["has_optimizer"]


def test_unstorable_extra_names_where(tmp_path):
    with pytest.raises(CheckpointError, match=r"extra\['config'\]\['f'\].*function"):
        save_checkpoint(tmp_path / "x.safetensors", {}, extra={"config": {"f": len}})
    with pytest.raises(CheckpointError, match=r"model_state\['w'\] is a list"):
        save_checkpoint(tmp_path / "x.safetensors", {"w": [1.0]})
    assert not os.path.exists(tmp_path / "x.safetensors")


def test_capture_restore_rng():
    state = capture_rng()
    first = (random.random(), np.random.rand(), torch.rand(2))
    restore_rng(state)
    second = (random.random(), np.random.rand(), torch.rand(2))
    assert first[:2] == second[:2] and torch.equal(first[2], second[2])


def test_rng_state_in_checkpoint(tmp_path):
    path = save_checkpoint(tmp_path / "r.safetensors", {"w": torch.ones(1)})
    expected = (random.random(), np.random.rand(), torch.rand(3))
    restore_rng(load_checkpoint(path).rng_state)
    assert (random.random(), np.random.rand()) == expected[:2] and torch.equal(torch.rand(3), expected[2])
    with safe_open(path, "pt") as f:
        assert f.get_tensor("rng.torch").dtype == torch.uint8


# ------------------------------------------------------------------ corrupted, truncated, foreign, missing
@pytest.fixture
def real_checkpoint(tmp_path):
    model = Tied()
    opt = build_optimizer(model.parameters(), "adam", lr=0.1)
    train_steps(model, opt, 1, 0)
    return str(save_checkpoint(tmp_path / "real.safetensors", model.state_dict(), opt.state_dict(), {"step": 1}))


def header_length(path):
    with open(path, "rb") as f:
        return int.from_bytes(f.read(8), "little")


def test_truncated_checkpoint(real_checkpoint):
    data = open(real_checkpoint, "rb").read()
    open(real_checkpoint, "wb").write(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="real.safetensors.*truncated"):
        load_checkpoint(real_checkpoint)


@pytest.mark.parametrize("where", ["json", "tensor_name", "metadata", "data"])
def test_flipped_bytes(real_checkpoint, where):
    data = bytearray(open(real_checkpoint, "rb").read())
    n = header_length(real_checkpoint)
    header = data[8:8 + n].decode()
    offset = {
        "json": 8 + header.index("{") + 0,  # the opening brace
        "tensor_name": 8 + header.index("model.hidden.weight") + 7,
        "metadata": 8 + header.index('\\"step\\":1') + 9,  # the digit 1 inside the JSON payload
        "data": 8 + n + 20,
    }[where]
    data[offset] ^= 0x04
    open(real_checkpoint, "wb").write(bytes(data))
    with pytest.raises(CheckpointError, match="real.safetensors") as info:
        load_checkpoint(real_checkpoint)
    if where in ("metadata", "data"):
        assert "corrupted" in str(info.value)


def test_not_a_checkpoint(tmp_path):
    plain = tmp_path / "plain.safetensors"
    save_file({"w": torch.ones(2)}, str(plain))
    with pytest.raises(CheckpointError, match="plain.safetensors: not a hyperplex checkpoint"):
        load_checkpoint(plain)
    text = tmp_path / "notes.txt"
    text.write_text("hello, not a checkpoint at all")
    with pytest.raises(CheckpointError, match="notes.txt: not a readable safetensors file"):
        load_checkpoint(text)
    with pytest.raises(CheckpointError, match="missing.safetensors: no such checkpoint file"):
        load_checkpoint(tmp_path / "missing.safetensors")
    with pytest.raises(CheckpointError, match="is a directory"):
        load_checkpoint(tmp_path)
    assert issubclass(CheckpointError, ValueError)


# ------------------------------------------------------------------ atomicity
def test_crash_during_save_keeps_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "last.safetensors"
    save_checkpoint(path, {"w": torch.zeros(1000)}, extra={"version": 1})

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(CheckpointError, match="last.safetensors: cannot write.*unchanged"):
        save_checkpoint(path, {"w": torch.ones(1000)}, extra={"version": 2})
    monkeypatch.undo()
    c = load_checkpoint(path)
    assert c.extra == {"version": 1} and torch.equal(c.model_state["w"], torch.zeros(1000))
    assert os.listdir(tmp_path) == ["last.safetensors"]  # the temporary file was removed


def test_unwritable_folder(tmp_path):
    missing_dir = tmp_path / "nope" / "c.safetensors"
    with pytest.raises(CheckpointError, match="c.safetensors: cannot write"):
        save_checkpoint(missing_dir, {"w": torch.ones(1)})


WRITER = """
import sys, torch
from hyperplex.train.checkpoint import save_checkpoint
path = sys.argv[1]
big = torch.empty(4_000_000)
for version in range(1, 10_000):
    save_checkpoint(path, {"w": big.fill_(float(version))}, extra={"version": version}, rng=False)
    print(version, flush=True)
"""


@pytest.mark.slow
def test_sigkill_during_writes_leaves_a_complete_file(tmp_path):
    path = tmp_path / "last.safetensors"
    env = {**os.environ, "PYTHONPATH": os.path.abspath(SRC)}
    for delay in (0.0, 0.13, 0.37):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, env=env, text=True)
        assert proc.stdout.readline().strip() == "1"  # one complete file exists
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        c = load_checkpoint(path)
        version = c.extra["version"]
        assert torch.equal(c.model_state["w"], torch.full((4_000_000,), float(version)))
        CheckpointManager(tmp_path)  # start-up removes the killed writer's temporary file
        assert sorted(os.listdir(tmp_path)) == ["last.safetensors"]


# ------------------------------------------------------------------ CheckpointManager
def state(value):
    return {"w": torch.full((3,), float(value))}


def test_manager_keeps_best_k_max(tmp_path):
    m = CheckpointManager(tmp_path, keep_best=2, metric_mode="max", metric_name="bleu")
    results = [m.save_if_best(v, step, state(v)) for step, v in enumerate([1.0, 3.0, 2.0, 0.5, 4.0, 3.0], start=1)]
    assert [r is not None for r in results] == [True, True, True, False, True, False]  # a tie keeps the earlier step
    assert [(e["step"], e["metric"]) for e in m.entries] == [(5, 4.0), (2, 3.0)]
    files = sorted(f for f in os.listdir(tmp_path))
    assert files == ["best-2.safetensors", "best-5.safetensors", "best.safetensors", "checkpoints.json"]
    assert os.path.samefile(tmp_path / "best.safetensors", tmp_path / "best-5.safetensors")
    assert torch.equal(load_checkpoint(tmp_path / "best.safetensors").model_state["w"], state(4.0)["w"])
    index = json.loads((tmp_path / "checkpoints.json").read_text())
    assert (index["metric_name"] == "bleu"
            and [e["file"] for e in index["best"]] == ["best-5.safetensors", "best-2.safetensors"])
    assert m.best_metric == 4.0 and m.is_better(4.5, m.best_metric) and not m.is_better(4.0, 4.0)
    # the bookkeeping survives a restart
    again = CheckpointManager(tmp_path, keep_best=2, metric_mode="max", metric_name="bleu")
    assert again.entries == m.entries
    assert again.save_if_best(3.5, 7, state(3.5)) is not None
    assert [e["step"] for e in again.entries] == [5, 7] and not os.path.exists(tmp_path / "best-2.safetensors")


def test_manager_min_mode_and_last(tmp_path):
    m = CheckpointManager(tmp_path, keep_best=1, metric_mode="min")
    m.save_if_best(2.0, 10, state(2.0))
    m.save_if_best(1.5, 20, state(1.5))
    assert m.save_if_best(1.7, 30, state(1.7)) is None
    assert sorted(os.listdir(tmp_path)) == ["best-20.safetensors", "best.safetensors", "checkpoints.json"]
    assert load_checkpoint(m.best_path).model_state["w"][0] == 1.5
    path = m.save_last(state(9), None, {"step": 30})
    assert path == m.last_path and load_checkpoint(path).extra == {"step": 30}
    with pytest.raises(ValueError, match="nan"):
        m.save_if_best(float("nan"), 40, state(0))


def test_manager_crash_during_best_save(tmp_path, monkeypatch):
    m = CheckpointManager(tmp_path, keep_best=1, metric_mode="max")
    m.save_if_best(1.0, 1, state(1.0))
    monkeypatch.setattr(os, "replace", lambda s, d: (_ for _ in ()).throw(OSError(5, "I/O error")))
    with pytest.raises(CheckpointError):
        m.save_if_best(2.0, 2, state(2.0))
    monkeypatch.undo()
    assert [e["step"] for e in m.entries] == [1]
    assert sorted(os.listdir(tmp_path)) == ["best-1.safetensors", "best.safetensors", "checkpoints.json"]
    assert load_checkpoint(m.best_path).model_state["w"][0] == 1.0


def test_manager_recovers_from_lost_index_and_orphans(tmp_path):
    m = CheckpointManager(tmp_path, keep_best=3, metric_mode="max")
    for step, v in [(1, 1.0), (2, 5.0), (3, 3.0)]:
        m.save_if_best(v, step, state(v))
    os.unlink(tmp_path / "checkpoints.json")  # as if killed before the index was written
    os.unlink(tmp_path / "best.safetensors")
    (tmp_path / ".last.safetensors.tmp-123-0123abcd").write_bytes(b"partial")  # a killed writer's leftovers
    again = CheckpointManager(tmp_path, keep_best=2, metric_mode="max")  # k lowered: the worst goes
    assert [(e["step"], e["metric"]) for e in again.entries] == [(2, 5.0), (3, 3.0)]
    assert sorted(os.listdir(tmp_path)) == ["best-2.safetensors", "best-3.safetensors", "best.safetensors",
                                            "checkpoints.json"]
    assert os.path.samefile(tmp_path / "best.safetensors", tmp_path / "best-2.safetensors")


def test_manager_resume_step_drops_later_bests_and_keeps_the_best_last_was_written_with(tmp_path):
    """A run that dies after writing best files but before writing ``last`` again: the resumed manager deletes the
    later bests, and the best that was on top when ``last`` was written is still there (kept on disk after better
    ones pushed it out of the top k, until the next ``last``)."""
    m = CheckpointManager(tmp_path, keep_best=1, metric_mode="max", metric_name="bleu")
    m.save_if_best(1.0, 10, state(1.0))
    m.save_last(state(10), None, {"step": 10})
    m.save_if_best(2.0, 20, state(2.0))
    m.save_if_best(3.0, 30, state(3.0))  # then killed: no last after step 10
    assert [e["step"] for e in m.entries] == [30]
    assert (tmp_path / "best-10.safetensors").exists() and not (tmp_path / "best-20.safetensors").exists()
    again = CheckpointManager(tmp_path, keep_best=1, metric_mode="max", metric_name="bleu", resume_step=10)
    assert again.dropped_steps == [30] and [(e["step"], e["metric"]) for e in again.entries] == [(10, 1.0)]
    assert sorted(os.listdir(tmp_path)) == ["best-10.safetensors", "best.safetensors", "checkpoints.json",
                                            "last.safetensors"]
    assert load_checkpoint(again.best_path).model_state["w"][0] == 1.0
    assert json.loads((tmp_path / "checkpoints.json").read_text())["best"] == again.entries
    again.save_if_best(4.0, 20, state(4.0))
    assert (tmp_path / "best-10.safetensors").exists()  # last still holds step 10's state
    again.save_last(state(20), None, {"step": 20})
    assert sorted(os.listdir(tmp_path)) == ["best-20.safetensors", "best.safetensors", "checkpoints.json",
                                            "last.safetensors"]
    third = CheckpointManager(tmp_path, keep_best=1, metric_mode="max", metric_name="bleu", resume_step=5)
    assert third.dropped_steps == [20] and third.entries == [] and not os.path.exists(third.best_path)
    plain = CheckpointManager(tmp_path, keep_best=1, metric_mode="max", metric_name="bleu")
    assert plain.dropped_steps == [] and plain.entries == []


def test_manager_refuses_other_metric(tmp_path):
    CheckpointManager(tmp_path, 1, "max", "bleu").save_if_best(1.0, 1, state(1))
    with pytest.raises(CheckpointError, match="ranked by 'bleu' \\(max\\).*'loss' \\(min\\)"):
        CheckpointManager(tmp_path, 1, "min", "loss")
    with pytest.raises(ValueError, match="keep_best"):
        CheckpointManager(tmp_path, 0, "max", "bleu")
    with pytest.raises(ValueError, match="metric_mode"):
        CheckpointManager(tmp_path, 1, "best", "bleu")


# ------------------------------------------------------------------ averaging
def test_average_checkpoints(tmp_path):
    paths = []
    for i, value in enumerate([1.0, 2.0, 6.0]):
        model = Tied()
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(value)
        sd = {**model.state_dict(), "count": torch.tensor(i)}
        paths.append(save_checkpoint(tmp_path / f"c{i}.safetensors", sd, rng=False))
    avg = average_checkpoints(paths)
    assert torch.equal(avg["hidden.weight"], torch.full((4, 4), 3.0)) and avg["count"] == 2  # integers: last
    assert avg["out.weight"] is avg["embed.weight"]
    out = save_model_weights(tmp_path / "averaged.safetensors", avg, {"averaged": [str(p) for p in paths]})
    c = load_checkpoint(out)
    assert c.kind == "weights" and c.extra["averaged"][0].endswith("c0.safetensors") and c.optimizer_state is None
    fresh = Tied()
    fresh.load_state_dict({k: v for k, v in load_model_weights(out).items() if k != "count"})
    assert torch.equal(fresh.embed.weight, torch.full((7, 4), 3.0))


def test_average_mismatch_names_key(tmp_path):
    a = save_checkpoint(tmp_path / "a.safetensors", {"w": torch.ones(2), "v": torch.ones(1)}, rng=False)
    b = save_checkpoint(tmp_path / "b.safetensors", {"w": torch.ones(3), "v": torch.ones(1)}, rng=False)
    c = save_checkpoint(tmp_path / "c.safetensors", {"w": torch.ones(2)}, rng=False)
    with pytest.raises(CheckpointError, match="b.safetensors: key 'w' has shape \\(3,\\)"):
        average_checkpoints([a, b])
    with pytest.raises(CheckpointError, match="c.safetensors: key 'v' is missing"):
        average_checkpoints([a, c])
    with pytest.raises(CheckpointError, match="no checkpoint paths"):
        average_checkpoints([])
