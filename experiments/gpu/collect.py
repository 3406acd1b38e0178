"""Summarise and pack one converge.sh call: a line per model, the records, the logs, resumable runs.

Used by ``experiments/gpu/converge.sh``; see its header. Writes at most five files into ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import platform
import re
import statistics
import tarfile
from pathlib import Path

import torch

RETURN_LIMIT = 16 * 2**20  # the largest file a device call brings back
RESUME_FILES = ("last.safetensors", "config.yaml", "experiment.json", "train.log", "metrics.csv")


def _best_bleu(metrics: Path) -> tuple[int, float | None]:
    """Last training step and best validation BLEU so far from a model's ``metrics.csv``."""
    step, best = 0, None
    if not metrics.is_file():
        return step, best
    with metrics.open(newline="") as handle:
        for row in csv.DictReader(handle):
            step = max(step, int(row["step"]))
            if row["split"] == "dev" and row["name"] == "bleu":
                best = max(best or float("-inf"), float(row["value"]))
    return step, best


_WINDOW = re.compile(r"step \d+ epoch \d+: loss \S+ lr \S+ (\d+) \S+/s$")
#: The trainer's lines that name a step boundary: a validation, a resume, an interruption's checkpoint, the end.
_AT_STEP = re.compile(r"\bat step (\d+)\b")


def _last_step(log: Path) -> int:
    """The latest step boundary ``log`` (a ``train.log``) names, 0 if none: a run stopped between two log lines
    (every ``training.log_every`` steps, which is all ``metrics.csv`` holds of training) saved its checkpoint at a
    step that only its log gives."""
    if not log.is_file():
        return 0
    return max((int(m.group(1)) for m in _AT_STEP.finditer(log.read_text(errors="replace"))), default=0)


def _steady_rate(log: Path) -> int | None:
    """Median training speed (the unit of the log: target tokens/s for translation) over the log windows of the
    latest segment of ``log`` (a ``train.log``) in which nothing but training ran: the window after a start, a
    resume or a validation also holds that work (the compilation, the decoding) and is left out."""
    if not log.is_file():
        return None
    rates: list[int] = []
    clean = False
    for line in log.read_text(errors="replace").splitlines():
        if "resumed from " in line or ": task " in line:  # a segment's first lines: its rates start anew
            rates, clean = [], False
        elif "validation at step" in line:
            clean = False
        elif match := _WINDOW.search(line):
            if clean:
                rates.append(int(match.group(1)))
            clean = True
    return int(statistics.median(rates)) if rates else None


def _seconds(run: Path) -> float:
    import json

    path = run / "experiment.json"
    if not path.is_file():
        return 0.0
    return sum(segment.get("seconds") or 0.0 for segment in json.loads(path.read_text()).get("segments", []))


def _header(device: str) -> str:
    card = torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else "cpu"
    driver = ""
    if device == "cuda":
        import subprocess

        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        try:
            driver = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):  # no nvidia-smi in the image: the summary matters more
            driver = ""
    return (f"# device {card}; driver {driver or '-'}; torch {torch.__version__}; CUDA {torch.version.cuda}; "
            f"python {platform.python_version()}")


def _pack(target: Path, root: Path, members: list[Path]) -> None:
    with tarfile.open(target, "w:gz") as tar:
        for path in members:
            tar.add(path, arcname=str(path.relative_to(root)))


def _pack_within_limit(target: Path, root: Path, members: list[Path], compression: int) -> int | None:
    """``members`` packed into ``target`` (paths relative to ``root``), kept only while the archive stays within the
    return limit (no ``target`` otherwise, not even one an earlier call into the same ``--out`` left); the archive's
    size, or ``None`` when the members exceed ``compression`` × the limit and are not packed at all: gzip shrinks
    them by less than that, and its minutes would come out of the call's last seconds."""
    target.unlink(missing_ok=True)
    if sum(p.stat().st_size for p in members) > compression * RETURN_LIMIT:
        return None
    _pack(target, root, members)
    size = target.stat().st_size
    if size > RETURN_LIMIT:
        target.unlink()
    return size


def _pack_compile_cache(folder: Path, target: Path) -> str:
    """``folder`` (TORCHINDUCTOR_CACHE_DIR) packed into ``target`` if that stays within the return limit; the
    summary's line about it. Compiled graphs and kernels are mostly text and compress a few times."""
    files = [p for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []
    if not files:
        target.unlink(missing_ok=True)
        return "# no torch.compile cache to bring back"
    size = _pack_within_limit(target, folder, files, compression=8)
    if size is None:
        raw = sum(p.stat().st_size for p in files)
        return (f"# torch.compile's cache ({len(files)} files, {raw / 2**20:.0f} MiB) is too large to bring back in "
                "16 MiB: not packed")
    if size > RETURN_LIMIT:
        return (f"# torch.compile's cache ({len(files)} files, {size / 2**20:.1f} MiB packed) is over the 16 MiB a "
                "returned file may have: not brought back")
    return (f"# compile-cache.tar.gz holds torch.compile's cache ({len(files)} files, {size / 2**20:.1f} MiB): carry "
            "it back as .gpu/compile-cache.tar.gz and later calls start their models from it")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan-name", required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compile-cache", type=Path, help="torch.compile's cache folder, packed when it fits")
    parser.add_argument("models", nargs="+", help="ROW:SEED")
    args = parser.parse_args(argv)
    runs, records = args.work / "runs" / args.plan_name, args.work / "records" / args.plan_name
    lines = [_header(args.device), "model\tstatus\tsteps\tbest_val_bleu\tseconds\tsteady_per_s"]
    unfinished = []
    for model in args.models:
        row, seed = model.split(":")
        run, record = runs / row / f"seed{seed}", records / row / f"seed{seed}"
        if (record / "record.json").is_file():
            status = "finished"
        elif (run / "last.safetensors").is_file():
            status = "unfinished"
            unfinished.append(run)
        elif run.is_dir() or (args.work / "logs" / f"{row}-seed{seed}.log").is_file():
            status = "failed"  # before its first checkpoint (it may have failed before making its folder)
        else:  # converge.sh --parallel did not reach it within the budget
            status = "not started"
        folder = record if status == "finished" else run
        step, best = _best_bleu(folder / "metrics.csv")
        step = max(step, _last_step(folder / "train.log"))
        seconds = _seconds(folder)
        rate = _steady_rate(folder / "train.log")
        lines.append(f"{row}:{seed}\t{status}\t{step}\t{'-' if best is None else f'{best:.2f}'}\t{seconds:.0f}"
                     f"\t{'-' if rate is None else rate}")
    args.out.mkdir(parents=True, exist_ok=True)
    if records.is_dir():
        _pack(args.out / f"records-{args.plan_name}.tar.gz", args.work / "records", [records])
    logs = args.work / "logs"
    if logs.is_dir():
        _pack(args.out / "logs.tar.gz", args.work, [logs])
    if unfinished:
        members = [run / name for run in unfinished for name in RESUME_FILES if (run / name).is_file()]
        members += [p for run in unfinished for p in run.iterdir() if p.name.startswith(("src", "tgt", "vocab"))]
        # float32 weights and moments compress by a few percent at most: twice the limit cannot fit
        size = _pack_within_limit(args.out / f"resume-{args.plan_name}.tar.gz", runs, members, compression=2)
        if size is not None and size <= RETURN_LIMIT:
            lines.append(f"# resume-{args.plan_name}.tar.gz holds {len(unfinished)} unfinished model(s): carry it "
                         "back as .gpu_resume/ to resume them")
        else:
            lines.append(f"# {len(unfinished)} unfinished model(s): their resumable state is over the 16 MiB a "
                         f"returned file may have; it stays in {args.work} on this machine, where the same "
                         "converge.sh command, made again before the machine is given back, resumes them; "
                         "elsewhere they restart from the beginning")
    summary = args.out / "converge-summary.txt"
    summary.write_text("\n".join(lines) + "\n")  # before the cache's packing, the one step that can take seconds
    if args.compile_cache is not None:
        lines.append(_pack_compile_cache(args.compile_cache, args.out / "compile-cache.tar.gz"))
        summary.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
