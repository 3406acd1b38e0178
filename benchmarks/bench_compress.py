#!/usr/bin/env python
"""Serving cost of a compressed sentence encoder: sentences/s at batch 1 and 32, memory held and peak memory,
bytes of weights in memory and on disk, for all-MiniLM-L6-v2 and its PHM, low-rank, int8 and combined forms,
as ratios to the dense teacher measured in the same run.

Usage (from the repository root; needs ``pip install "hyperplex[pretrained]"``)::

    PYTHONPATH=src python benchmarks/bench_compress.py --quick --threads 1      # 3 rounds of 32 sentences
    PYTHONPATH=src python benchmarks/bench_compress.py --threads 1              # 7 rounds of 64 sentences
    PYTHONPATH=src python benchmarks/bench_compress.py --variants phm4 phm4:cache int8 phm4+int8 --threads 1
    PYTHONPATH=src python benchmarks/bench_compress.py --threads 1 --out serving.json    # also write the rows
    PYTHONPATH=src python benchmarks/bench_compress.py --quick --device cuda --variants phm4 lowrank4 --out gpu.json

Models (``--variants``; the dense teacher is always the first row):

- ``phmN`` / ``lowrankN``: :func:`hyperplex.compress` (``PHMConfig`` / ``LowRankConfig``) with that ``n`` on the layers
  matching ``--include`` (low-rank at the rank matching PHM ``n``'s parameters), written with
  :func:`~hyperplex.convert.save_converted` and loaded with :func:`~hyperplex.convert.load_converted`;
- ``int8``: the teacher through :func:`hyperplex.int8` (PyTorch's dynamic int8 quantisation),
  written with ``save_quantized`` and loaded with ``load_quantized``; ``phmN+int8`` / ``lowrankN+int8``: the
  converted model quantised the same way (the ``Sᵢ`` / ``left``, ``right`` in int8);
- ``keepK``: layer dropping — the teacher with ``K`` of its encoder layers kept, evenly spread (4 of 6: layers
  0, 2, 3, 5; 3 of 6: 0, 2, 5, the layers of the frontier plan's rows), saved and loaded as a plain
  SentenceTransformer folder;
- ``phmN:cache``: ``phmN`` loaded, then :func:`hyperplex.layers.cache_dense_weights` (every PHM layer keeps its
  dense ``H`` in inference: the dense matmul's speed at ``n×`` the factor memory), to show that trade-off.

Converted copies use ``init="random"``: speed and memory do not depend on the weights, and no SVD is spent.

Method. Every model lives in **its own fresh process** (this script with ``--worker``), which loads it the way a
user would — the teacher with ``SentenceTransformer(folder)``, the others from their saved folder — so no
process holds pages freed by a conversion. Every folder, the teacher's included, is first copied by one routine
(:func:`same_page_cache_history`): the weights are memory-mapped, and a file just written is mapped in larger
pieces than an old one, which once charged a just-saved model 7 MB of embedding rows. Each process reports its
resident memory after loading and after the last encode (``/proc/self/statm``; after the encode also split, from
``/proc/self/status``, into ``RssAnon`` — the heap: tensors, activations and what the allocator keeps freed — and
``RssFile`` — mapped files: the memory-mapped weights, shared libraries; the ``Δ heap`` and ``Δ files`` columns —
and once more after glibc's ``malloc_trim(0)``, which returns the heap's free pages: ``Δ trimmed``, the memory in
use), its peak resident memory (``VmHWM``, see :func:`_peak_bytes`), and the bytes of the model's parameters +
buffers + cached ``H`` (+ packed int8 weights and their scales). The memory columns are the median over
``--memory-samples`` processes per model of their own (:func:`measure_memory`: one process's heap is one draw of
a figure that moves by ±10 MB). The parent process then times ``SentenceTransformer.encode`` (tokenisation,
padding to the longest in each batch, pooling and normalisation included) in interleaved rounds: in each round
every process encodes the same ``--sentences`` fixed English sentences (8 to 20 words, seeded) once at each batch
size, one process at a time, the order rotating every round (``benchmarks/harness.py``), after one warm-up encode
of every sentence at each batch size (so that on CUDA every input shape's kernels are compiled before timing).
With ``--device cuda`` every model runs on the card (CUDA events time the encode; ``GPU held`` and ``GPU peak``
are the allocator's figures and the ones to compare: the host columns then also hold the CUDA context, and Triton's
compiler in the processes whose layers take the fused kernel; the int8 variants are CPU-only), ``--bf16`` in
bfloat16. Speed = sentences /
seconds; ``×`` = median over rounds of (the model's speed / the teacher's in the same round): above 1 = faster than the
teacher. Memory ``×`` columns are the model's figure minus the teacher's (negative = smaller). ``file`` is the
size of the weight files the folder holds (``*.safetensors``; the teacher: written by ``save_converted``,
float32, like the converted rows). ``--out FILE`` (or ``--json FILE``) writes the rows, each memory sample
included (and the run's date, machine, threads, rounds, memory samples) for
``hyperplex report frontier --serving FILE``.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SRC = str(Path(__file__).resolve().parents[1] / "src")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the harness, run as a script or loaded by path
import harness  # noqa: E402

_VOCABULARY = ("a man woman child dog group people street city park water beach snow ball red blue green young old "
               "two three is are sits stands runs walks plays holds looks wearing with on in at near the of while "
               "during small large white black shirt hat jacket bike car house tree field crowd music food table "
               "window")
WORDS = tuple(_VOCABULARY.split())
MB = 1e6


def fixed_sentences(count: int, seed: int = 0) -> list[str]:
    """``count`` sentences of 8–20 words from :data:`WORDS`, the same for the same seed."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20))).capitalize() + "." for _ in range(count)]


def parse_variant(text: str) -> tuple[str, int, bool, bool]:
    """``(kind, n, int8, cache)`` of a variant name: ``int8``, ``phm4``, ``lowrank8+int8``, ``phm4:cache``,
    ``keep3`` (kind ``keep``, ``n`` = layers kept)."""
    if text == "int8":
        return "none", 0, True, False
    if text.startswith("keep") and text[4:].isdigit() and int(text[4:]) > 0:
        return "keep", int(text[4:]), False, False
    base, cache = (text[:-len(":cache")], True) if text.endswith(":cache") else (text, False)
    base, int8 = (base[:-len("+int8")], True) if base.endswith("+int8") else (base, False)
    for kind in ("phm", "lowrank"):
        if base.startswith(kind) and base[len(kind):].isdigit() and int(base[len(kind):]) > 0:
            if cache and (kind != "phm" or int8):
                break
            return kind, int(base[len(kind):]), int8, cache
    raise argparse.ArgumentTypeError(f"variant {text!r}: expected int8, phmN, lowrankN, phmN+int8, lowrankN+int8, "
                                     "phmN:cache or keepK, e.g. phm4, lowrank4+int8, keep3")


def spread_layers(total: int, keep: int) -> list[int]:
    """``keep`` of ``total`` layer indices, evenly spread, first and last included (6, 4 → 0, 2, 3, 5)."""
    if not 0 < keep <= total:
        raise ValueError(f"cannot keep {keep} of {total} layers")
    if keep == 1:
        return [0]
    return sorted({round(i * (total - 1) / (keep - 1)) for i in range(keep)})


def drop_layers(model, keep: int) -> list[int]:
    """Keep ``keep`` evenly spread encoder layers of a SentenceTransformer in place; returns their indices."""
    import torch

    encoder = model[0].auto_model.encoder
    kept = spread_layers(len(encoder.layer), keep)
    encoder.layer = torch.nn.ModuleList(encoder.layer[i] for i in kept)
    model[0].auto_model.config.num_hidden_layers = len(kept)
    return kept


# ----------------------------------------------------------------------------- building the saved folders
def weight_file_bytes(folder: str) -> int:
    """Bytes of the ``*.safetensors`` files under ``folder`` (``model.safetensors``, ``model.int8.safetensors``)."""
    return sum(path.stat().st_size for path in Path(folder).rglob("*.safetensors"))


def prepare(args, root: str) -> dict[str, dict]:
    """Write every variant's folder under ``root``; returns ``{name: {"folder", "loader", "cache"}}``."""
    import torch

    from hyperplex import LowRankConfig, PHMConfig, compress
    from hyperplex.convert import save_converted
    from hyperplex.int8 import quantize, save_quantized
    from hyperplex.pretrained import load_sentence_transformer, resolve_model_path

    teacher_folder = resolve_model_path(args.model)
    specs = {"dense": {"folder": teacher_folder, "loader": "teacher", "cache": False, "file_bytes": None,
                       "selected_params": None}}
    built: dict[tuple[str, int, bool], tuple[str, int | None]] = {}
    for name in args.variants:
        kind, n, int8, cache = parse_variant(name)
        key = (kind, n, int8)
        if key not in built:
            torch.manual_seed(0)
            model = load_sentence_transformer(args.model)
            selected = None
            if kind == "keep":
                folder = os.path.join(root, name)
                drop_layers(model, n)
                model.save(folder)
                specs[name] = {"folder": folder, "loader": "teacher", "cache": False,
                               "file_bytes": weight_file_bytes(folder), "selected_params": None}
                continue
            if kind != "none":
                config = (PHMConfig if kind == "phm" else LowRankConfig)(
                    n=n, targets=args.include or None, min_features=args.min_features, init="random")
                report = compress(model, config)
                selected = report.converted_params_after
                specs["dense"]["selected_params"] = report.converted_params_before
            folder = os.path.join(root, name.replace(":cache", "").replace("+", "_"))
            (save_quantized if int8 else save_converted)(quantize(model) if int8 else model, folder)
            built[key] = folder, selected
            del model
        folder, selected = built[key]
        specs[name] = {"folder": folder, "loader": "quantized" if int8 else "converted", "cache": cache,
                       "file_bytes": weight_file_bytes(folder), "selected_params": selected}
    # the teacher's weights written by the same writer, for a like-for-like file column
    dense_folder = os.path.join(root, "dense")
    save_converted(load_sentence_transformer(args.model), dense_folder)
    specs["dense"]["file_bytes"] = weight_file_bytes(dense_folder)
    return same_page_cache_history(specs, root)


def same_page_cache_history(specs: dict[str, dict], root: str) -> dict[str, dict]:
    """Point every model at a copy of its folder made by one routine (``shutil.copytree``), the teacher's too.

    The weights are memory-mapped, so resident memory counts the file pages a process has mapped, and how many
    pages one touch maps depends on how the file entered the page cache. On this VM (Linux 6.18, ext4) a file just
    written by ``save_converted`` was mapped in runs of 512–2,048 pages where the teacher's installed file was mapped
    in runs of 16–200: encoding the same 64 sentences left 10.2 MB of the word-embedding table resident in the
    PHM model against 2.9 MB in the teacher (the same 78 token ids), charging the model just saved about 7 MB that
    has nothing to do with its architecture. Copied by the same routine, both map 2.9–3.2 MB."""
    copies: dict[str, Any] = {}
    for name, spec in specs.items():
        source = spec["folder"]
        if source not in copies:
            copies[source] = shutil.copytree(source, os.path.join(root, "measured", f"{len(copies)}-{name}"))
        spec["folder"] = copies[source]
    return specs


# ----------------------------------------------------------------------------- one model, one process
def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _status_bytes(*fields: str) -> dict[str, int]:
    """The named ``kB`` fields of ``/proc/self/status`` (``VmHWM``, ``RssAnon``…), in bytes; those it lacks, or all
    where there is no /proc, are left out."""
    found = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in fields:
                    found[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return found


def _peak_bytes() -> int:
    """Peak resident memory of this process: ``VmHWM`` of ``/proc/self/status``. Not ``ru_maxrss``: Linux
    keeps that across ``execve``, so a process started by a large parent reports the parent's peak."""
    peak = _status_bytes("VmHWM").get("VmHWM")
    if peak is not None:
        return peak
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # no /proc: the best figure there is
    return peak if sys.platform == "darwin" else peak * 1024


def _resident_split() -> dict:
    """``RssAnon`` (heap: tensors, activations, the allocator's free lists) and ``RssFile`` (mapped files: the
    memory-mapped weights, shared libraries) of ``/proc/self/status``, in bytes; empty where there is no /proc."""
    split = _status_bytes("RssAnon", "RssFile")
    return {f"resident_{key[3:].lower()}": value for key, value in split.items()}


def _resident_trimmed() -> dict:
    """Resident memory after glibc's ``malloc_trim(0)`` has handed the heap's free pages back to the system:
    the memory the process *uses*, without what the allocator keeps after frees (on this VM 12–30 MB after
    encoding, different in every process, for the teacher and a converted model alike: trimmed, both heaps came
    to the same 347 MB). Empty where there is no glibc. Call it last: it changes the figures it is compared with."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return {}
    trim(0)
    return {"resident_trimmed": _resident_bytes()}


def _held_bytes(model) -> int:
    """Parameters + buffers + packed int8 weights (hyperplex.int8.model_bytes) + cached H + the
    thread's reused buffer for the H formed per call (hyperplex.layers.functional.formation_buffer)."""
    from hyperplex.int8 import model_bytes
    from hyperplex.layers import cached_bytes
    from hyperplex.layers.functional import formation_buffer_bytes

    return model_bytes(model) + cached_bytes(model) + formation_buffer_bytes()


def worker(spec: dict) -> None:
    """The model process: load one model as a user would, then answer one JSON request per stdin line —
    ``{"encode": batch}`` (speed of encoding ``spec["sentences"]``) or ``{"stats": true}`` — with one JSON line."""
    import torch

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    device = torch.device(spec.get("device", "cpu"))
    model: Any  # a SentenceTransformer, however it was loaded
    if spec["loader"] == "teacher":
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(spec["folder"], device="cpu").eval()
    elif spec["loader"] == "converted":
        from hyperplex.convert import load_converted

        model = load_converted(spec["folder"])
    else:
        from hyperplex.int8 import load_quantized

        model = load_quantized(spec["folder"])
    if spec["cache"]:
        from hyperplex.layers import cache_dense_weights

        cache_dense_weights(model)
    model.to(device)
    if spec.get("bf16"):
        model.to(torch.bfloat16)
    stats = {"params": sum(p.numel() for p in model.parameters()), "resident_loaded": _resident_bytes()}
    sentences = spec["sentences"]
    reply = sys.stdout
    sys.stdout = sys.stderr  # library prints must not corrupt the replies
    print(json.dumps({"ready": True}), file=reply, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        answer: float | dict[str, Any]
        if "encode" in request:
            batch = request["encode"]
            with torch.inference_mode():
                encode = functools.partial(model.encode, sentences, batch_size=batch, convert_to_tensor=True,
                                           show_progress_bar=False)
                answer = len(sentences) / harness.time_per_call(encode, 1, device)
        else:
            figures: dict[str, Any] = {**stats, "held": _held_bytes(model), "resident": _resident_bytes(),
                                       **_resident_split(), "peak": _peak_bytes()}
            if device.type == "cuda":  # the allocator's figures: what the model and its encoding held on the card
                figures.update(gpu_held=torch.cuda.memory_allocated(device),
                               gpu_peak=torch.cuda.max_memory_allocated(device))
            figures.update(_resident_trimmed())  # last: it frees what the figures above count
            answer = figures
        print(json.dumps(answer), file=reply, flush=True)


class ModelProcess:
    """A fresh Python process running :func:`worker` on one model (``python bench_compress.py --worker SPEC``)."""

    def __init__(self, name: str, spec: dict) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))}
        self.name = name
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both are pipes
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self._read()  # {"ready": true}

    def _read(self):
        line = self.stdout.readline()
        if not line:
            raise RuntimeError(f"the process of model {self.name!r} ended with exit code {self.proc.wait()} "
                               "(its error is above)")
        return json.loads(line)

    def ask(self, request: dict):
        self.stdin.write(json.dumps(request) + "\n")
        self.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def measure(specs: dict, sentences: list[str], batch_sizes: list[int], rounds: int, threads: int | None,
            **where) -> dict:
    """Per model: its stats, ``speed[b]`` (median sentences/s) and ``ratio[b]`` (median of speed / the teacher's);
    ``where``: ``device`` and ``bf16`` for the model processes."""
    names, procs = list(specs), {}
    try:
        for name in names:  # one at a time, so no load competes with another for the CPU
            procs[name] = ModelProcess(name, {**specs[name], "sentences": sentences, "threads": threads, **where})
        for name in names:  # warm-up: every sentence, so every input shape (a Triton specialisation on CUDA)
            for b in batch_sizes:
                procs[name].ask({"encode": b})
        speeds: dict[tuple[str, int], list[float]] = {(name, b): [] for name in names for b in batch_sizes}
        ratios: dict[tuple[str, int], list[float]] = {(name, b): [] for name in names for b in batch_sizes}
        for order in harness.rotations(names, rounds):
            this = {(name, b): procs[name].ask({"encode": b}) for name in order for b in batch_sizes}
            for key, speed in this.items():
                speeds[key].append(speed)
                ratios[key].append(speed / this[("dense", key[1])])
        return {name: {"stats": procs[name].ask({"stats": True}),
                       "speed": {b: statistics.median(speeds[(name, b)]) for b in batch_sizes},
                       "ratio": {b: statistics.median(ratios[(name, b)]) for b in batch_sizes}} for name in names}
    finally:
        for proc in procs.values():
            proc.close()


#: The memory figures of a worker, each the median over ``--memory-samples`` fresh processes.
MEMORY_KEYS = ("resident_loaded", "resident", "resident_anon", "resident_file", "peak", "resident_trimmed", "gpu_held",
               "gpu_peak")


def measure_memory(specs: dict, sentences: list[str], batch_sizes: list[int], samples: int,
                   threads: int | None, **where) -> dict:
    """Per model: the median of each of :data:`MEMORY_KEYS` over ``samples`` fresh processes, and every sample.

    One process is one draw of a noisy figure: the heap (``RssAnon``) of the same model encoding the same
    sentences moved by ±10 MB from process to process on this project's VM, for the teacher and a converted model
    alike, while the mapped weights (``RssFile``) did not move at all. So every model is loaded again in
    ``samples`` processes of its own, one process at a time (models interleaved: sample 1 of every model, then
    sample 2, …), each encoding the sentences once at every batch size before it reports."""
    names = list(specs)
    drawn: dict[str, list] = {name: [] for name in names}
    for _ in range(samples):
        for name in names:
            proc = ModelProcess(name, {**specs[name], "sentences": sentences, "threads": threads, **where})
            try:
                for b in batch_sizes:
                    proc.ask({"encode": b})
                drawn[name].append(proc.ask({"stats": True}))
            finally:
                proc.close()
    return {name: {**{key: statistics.median(s[key] for s in drawn[name]) for key in MEMORY_KEYS
                      if all(key in s for s in drawn[name])},
                   "memory_samples": [{key: s[key] for key in MEMORY_KEYS if key in s} for s in drawn[name]]}
            for name in names}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm", help="SentenceTransformer folder, or minilm (default)")
    parser.add_argument("--variants", nargs="+", type=str,
                        default=["phm2", "phm4", "phm8", "lowrank2", "lowrank4", "lowrank8", "int8", "phm4+int8",
                                 "lowrank4+int8", "phm4:cache"],
                        help="int8, phmN, lowrankN (at PHM n's parameters), phmN+int8, lowrankN+int8, phmN:cache; "
                             "default phm2 phm4 phm8 lowrank2 lowrank4 lowrank8 int8 phm4+int8 lowrank4+int8 "
                             "phm4:cache")
    parser.add_argument("--include", nargs="*", default=["*encoder.layer*"],
                        help="glob patterns of the layers to convert (default: the encoder blocks)")
    parser.add_argument("--min-features", type=int, default=32, help="layers with min(in, out) below stay dense")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 32], help="default 1 32")
    parser.add_argument("--sentences", type=int, default=None, help="sentences per measurement; default 64 (quick: 32)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds; default 7 (quick: 3)")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 32 sentences, 1 memory sample")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per model process; default torch's")
    parser.add_argument("--memory-samples", type=int, default=None,
                        help="fresh processes per model for the memory columns (each the median over them); "
                             "default 3 (quick: 1)")
    parser.add_argument("--bf16", action="store_true", help="models in bfloat16 (default float32)")
    harness.add_arguments(parser, threads=False)  # --device, --out (alias --json; for hyperplex.experiments.frontier)
    args = parser.parse_args(argv)
    if args.device == "cuda" and any(parse_variant(name)[2] for name in args.variants):
        parser.error("--device cuda: the int8 variants (PyTorch's dynamic quantisation) run on the CPU only")
    for name in args.variants:
        try:
            parse_variant(name)
        except argparse.ArgumentTypeError as error:
            parser.error(str(error))
    if len(set(args.variants)) != len(args.variants) or "dense" in args.variants:
        parser.error("--variants: each name once, and not 'dense' (the teacher is always measured)")
    for option in ("rounds", "sentences", "memory_samples"):
        if getattr(args, option) is not None and getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be positive, not {getattr(args, option)}")
    rounds = args.rounds or (3 if args.quick else 7)
    samples = args.memory_samples or (1 if args.quick else 3)
    count = args.sentences or (32 if args.quick else 64)
    sentences = fixed_sentences(count)
    device = harness.setup(args)
    where = {"device": args.device, "bf16": args.bf16}
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-compress-") as root:
        specs = prepare(args, root)
        print(f"# bench_compress — model {args.model}, device {device}{', bf16' if args.bf16 else ''}, "
              f"{args.threads or 'default'} torch threads per model")
        print(f"# {harness.header(harness.machine(device))}")
        print(f"# {count} sentences, {rounds} interleaved rounds, one fresh process per model; sent/s = median over "
              "rounds; × = median over rounds of (model speed / teacher speed in the same round), above 1 = faster; "
              f"memory in MB, median over {samples} fresh process(es) per model, Δ = model − teacher\n")
        results = measure(specs, sentences, args.batch_sizes, rounds, args.threads, **where)
        memory = measure_memory(specs, sentences, args.batch_sizes, samples, args.threads, **where)
        for name, result in results.items():  # the memory columns: the medians of the dedicated processes
            result["stats"] = {**{k: v for k, v in result["stats"].items() if k not in MEMORY_KEYS}, **memory[name]}
    header = ["model", "float params", "params of converted layers", "weights held", "file", "resident", "Δ resident",
              "Δ heap", "Δ files", "Δ trimmed", "peak", "Δ peak"] + (["GPU held", "GPU peak"] if device.type == "cuda"
                                                                      else [])
    for b in args.batch_sizes:
        header += [f"batch {b} sent/s", f"batch {b} ×"]
    print("| " + " | ".join(header) + " |")
    print("|---|" + "---:|" * (len(header) - 1))
    teacher = results["dense"]["stats"]
    rows = []
    for name, result in results.items():
        stats = result["stats"]
        row = {"name": name, "file_bytes": specs[name]["file_bytes"], "selected_params": specs[name]["selected_params"],
               **stats,
               **{f"speed_b{b}": result["speed"][b] for b in args.batch_sizes},
               **{f"ratio_b{b}": result["ratio"][b] for b in args.batch_sizes}}
        selected = row["selected_params"]
        cells = [name, f"{stats['params']:,}", f"{selected:,}" if selected else "–", f"{stats['held'] / MB:.1f}",
                 f"{row['file_bytes'] / MB:.1f}",
                 f"{stats['resident'] / MB:.0f}", f"{(stats['resident'] - teacher['resident']) / MB:+.0f}",
                 *(f"{(stats[key] - teacher[key]) / MB:+.0f}" if key in stats and key in teacher else "–"
                   for key in ("resident_anon", "resident_file", "resident_trimmed")),
                 f"{stats['peak'] / MB:.0f}", f"{(stats['peak'] - teacher['peak']) / MB:+.0f}"]
        if device.type == "cuda":
            cells += [f"{stats['gpu_held'] / MB:.1f}", f"{stats['gpu_peak'] / MB:.1f}"]
        for b in args.batch_sizes:
            cells += [f"{result['speed'][b]:.1f}", f"{result['ratio'][b]:.2f}"]
        rows.append(row)
        print("| " + " | ".join(cells) + " |", flush=True)
    print(f"\n# load average at end {os.getloadavg()[0]:.2f}")
    if args.out:
        from hyperplex.fileio import atomic_write_text

        info = harness.machine(device)
        run = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "model": args.model,
               "machine": f"{info['cpu']}, {info['logical_cores']} cores", "machine_info": info,
               "device": args.device, "bf16": args.bf16,
               "torch": info["torch"], "threads": args.threads, "rounds": rounds, "sentences": count,
               "memory_samples": samples,
               "batch_sizes": args.batch_sizes, "load_average": [load_start, os.getloadavg()[0]], "rows": rows}
        atomic_write_text(args.out, json.dumps(run, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
    else:
        main()
