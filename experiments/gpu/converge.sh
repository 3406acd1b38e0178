#!/usr/bin/env bash
# Train several models of a convergence plan side by side on one GPU within one device call.
#
#   bash experiments/gpu/converge.sh --plan experiments/multi30k_converged.yaml \
#        --models "small_transformer:1 small_phm4:1 small_lowrank4:1" [--budget-s 480] \
#        [--data .gpu/data] [--device cuda] [--work .gpu_work] [--cpus N] [--compile on|off] [--parallel N]
#        [--compile-cache .gpu/compile-cache.tar.gz] [--check | --checked]
#
# --check: validate the arguments, the models and the plan (its dry run for the rows and seeds named), then exit
# without training (benchmarks/gpu/check.sh runs it first, so that a mistake costs seconds, not the call's training).
# --checked: the caller ran --check with the same plan and models moments ago; skip the plan's dry run (seconds of
# device time). The arguments and the skipping of recorded models are checked all the same.
# The budget counts from the start of the script.
#
# Small models leave most of a GPU idle, so each model is its own `hyperplex experiment` process
# (--rows ROW --seeds SEED --resume --evaluate-each --records ...), --parallel of them at a time (default: all at
# once) in the order named, the next one starting as soon as one ends, sharing --cpus cores (default: all) as torch
# threads. Each gets `timeout -s TERM` at the budget: the trainer saves a resumable
# last checkpoint on SIGTERM, so a model that does not finish in time is checkpointed, not lost. At the end, under $OUT (at most 5 files):
#   converge-summary.txt   one line per model: finished / unfinished / failed / not started, steps, best
#                          validation BLEU, wall seconds, steady speed (median tokens/s of the latest segment's
#                          log windows that hold only training); the device, driver and torch in its header
#   records-PLAN.tar.gz    the records of every finished model (experiments/records/PLAN/ROW/seedK:
#                          config, logs, metrics, beam-5 evaluation; no checkpoint), to unpack into the repo
#   logs.tar.gz            every process's output
#   resume-PLAN.tar.gz     the unfinished models' folders (last checkpoint, tokenizer, logs), only while it
#                          stays under the 16 MiB a returned file may have; carry it back as
#                          .gpu_resume/resume-PLAN.tar.gz and the next call resumes those models. A small
#                          model's resumable state (weights + Adam moments) is larger than that: such a
#                          model resumes only on the same machine, from --work.
#   compile-cache.tar.gz   with --compile on, torch.compile's cache (below), while it stays under 16 MiB; carry
#                          it back as .gpu/compile-cache.tar.gz
# --work (default .gpu_work, git-ignored, in the repository root) holds the runs and records. The device machine
# keeps it between calls while it stays warm, so a second call with the same --models, made at once, resumes the
# unfinished models and does not train the finished ones again (their records are packed again).
# The data travels with the call: copy the plan's data folders into .gpu/data/ (git-ignored) and carry .gpu.
# --compile (default: on with --device cuda, off on the CPU) trains through torch.compile (training.compile, a key
# of how a model runs, not of what it computes): a base-shape step in eager mode is bound by its kernel launches.
# A model whose compilation fails (the trainer stops with one line that says so, having saved the step before if
# that step had updated) goes on at once without it, from that checkpoint if there is one, in the time left; its
# log and experiment.json say where it switched, its record's config how it ended.
# With --compile on, torch.compile's caches (Inductor's compiled graphs and their Triton kernels) live in
# $work/compile-cache (TORCHINDUCTOR_CACHE_DIR, unless the environment sets it), seeded once from --compile-cache
# (default .gpu/compile-cache.tar.gz, when it is there: an earlier session's compile-cache.tar.gz, carried back), and
# packed into compile-cache.tar.gz under $OUT when it fits: a model whose graphs are cached skips most of its
# compilation (tracing remains); entries made by another torch, Triton or card are not used (torch checks), so a
# stale cache costs nothing but its transfer.
# Each model writes its resumable last checkpoint only when it stops (its end, or the budget's SIGTERM), not at every
# validation (training.last_at_validation=false): a base-shape state is ~600 MB, written ~once an epoch otherwise.
# Dry run on the CPU:  bash experiments/gpu/converge.sh --device cpu --budget-s 60 --models "small_phm4:1" ...
set -uo pipefail
start=$(date +%s)  # the budget counts from here: the checks before training are part of the call
cd "$(dirname "$0")/../.."
check_only=""; checked=""; plan=""; models=""; budget=480; data=".gpu/data"; device="cuda"; work=".gpu_work"; cpus=$(nproc); compile=""; parallel=""
compile_cache=".gpu/compile-cache.tar.gz"
while [[ $# -gt 0 ]]; do
    case $1 in
        --plan) plan=$2; shift 2 ;;
        --models) models=$2; shift 2 ;;
        --budget-s) budget=$2; shift 2 ;;
        --data) data=$2; shift 2 ;;
        --device) device=$2; shift 2 ;;
        --work) work=$2; shift 2 ;;
        --cpus) cpus=$2; shift 2 ;;
        --compile) compile=$2; shift 2 ;;
        --parallel) parallel=$2; shift 2 ;;
        --compile-cache) compile_cache=$2; shift 2 ;;
        --check) check_only=1; shift ;;
        --checked) checked=1; shift ;;
        -h|--help) sed -n 2,50p "$0"; exit 0 ;;
        *) echo "converge.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ -z $check_only || -z $checked ]] || { echo "converge.sh: --check and --checked exclude each other" >&2; exit 2; }
[[ -f $plan ]] || { echo "converge.sh: --plan: no such file '$plan'" >&2; exit 2; }
[[ -n $models ]] || { echo "converge.sh: --models 'ROW:SEED ...' is required" >&2; exit 2; }
[[ $budget =~ ^[0-9]+$ && $budget -ge 30 ]] || { echo "converge.sh: --budget-s must be a whole number of seconds ≥ 30, got '$budget'" >&2; exit 2; }
[[ $cpus =~ ^[0-9]+$ && $cpus -ge 1 ]] || { echo "converge.sh: --cpus must be a whole number ≥ 1, got '$cpus'" >&2; exit 2; }
[[ -z $parallel || $parallel =~ ^[1-9][0-9]*$ ]] || { echo "converge.sh: --parallel must be a whole number ≥ 1, got '$parallel'" >&2; exit 2; }
[[ -z $compile ]] && compile=$([[ $device == cuda ]] && echo on || echo off)
[[ $compile == on || $compile == off ]] || { echo "converge.sh: --compile must be on or off, got '$compile'" >&2; exit 2; }
[[ -d $data ]] || { echo "converge.sh: --data: no folder '$data' (copy the plan's data folders there and carry it)" >&2; exit 2; }
python=${HYPERPLEX_PYTHON:-python3}
out=${OUT:-/tmp/hyperplex-converge-out}
plan_name=$(basename "$plan" .yaml)
mkdir -p "$work/logs" "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HYPERPLEX_DATA="$(cd "$data" && pwd)"
if [[ $device == cuda ]] && ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "converge.sh: --device cuda but torch sees no GPU here (use --device cpu for a dry run)" >&2; exit 2
fi
for m in $models; do
    [[ $m =~ ^[A-Za-z0-9_.+-]+:[0-9]+$ ]] || { echo "converge.sh: '$m' is not ROW:SEED" >&2; exit 2; }
done
# a model whose record is already in the repository (trained on a CPU lane or an earlier GPU session) is left out;
# one finished by an earlier call into the same --work is not trained again but stays in the summary and the packed
# records; a model named twice trains once: device time is the scarce thing
named=""; todo=""
for m in $models; do
    row=${m%%:*}; seed=${m##*:}
    if [[ -f experiments/records/$plan_name/$row/seed$seed/record.json ]]; then
        echo "converge.sh: $m is already recorded in experiments/records/$plan_name/$row/seed$seed: skipped"
    elif [[ " $named " != *" $m "* ]]; then
        named="$named $m"
        if [[ -f $work/records/$plan_name/$row/seed$seed/record.json ]]; then
            echo "converge.sh: $m finished in an earlier call into $work: not trained again"
        else
            todo="$todo $m"
        fi
    fi
done
named=${named# }; models=${todo# }
[[ -n $named ]] || { echo "converge.sh: every model named is already recorded; nothing to train"; exit 0; }
cache_dir=""
if [[ $compile == on ]]; then
    export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$(cd "$work" && pwd)/compile-cache}"
    cache_dir=$TORCHINDUCTOR_CACHE_DIR
    if [[ -z $check_only && -f $compile_cache && ! -e $work/compile-cache.seeded ]]; then
        # unpacked aside and copied in only whole: a truncated or corrupt file adds nothing to the cache
        unpack="$work/compile-cache.unpack"
        rm -rf "$unpack"; mkdir -p "$unpack" "$cache_dir"
        if tar -xzf "$compile_cache" -C "$unpack" && cp -a "$unpack/." "$cache_dir/"; then
            touch "$work/compile-cache.seeded"
            echo "converge.sh: torch.compile's cache seeded from $compile_cache"
        else
            echo "converge.sh: $compile_cache could not be unpacked; compiling without it"
        fi
        rm -rf "$unpack"
    fi
fi
collect() {
    "$python" experiments/gpu/collect.py --plan-name "$plan_name" --work "$work" --out "$out" --device "$device" \
        ${cache_dir:+--compile-cache "$cache_dir"} $named
}
if [[ -z $models ]]; then
    echo "converge.sh: every model named finished in an earlier call into $work"
    [[ -n $check_only ]] || collect
    exit 0
fi
# every model of the call is validated against the plan before anything trains
rows=$(for m in $models; do echo "${m%%:*}"; done | sort -u | paste -sd,)
seeds=$(for m in $models; do echo "${m##*:}"; done | sort -un | paste -sd,)
if [[ -n $checked ]]; then
    echo "converge.sh: --checked: the plan's dry run for rows $rows is skipped (the caller's --check ran it)"
else
    "$python" -m hyperplex experiment "$plan" --rows "$rows" --seeds "$seeds" --dry-run --resume \
        --out "$work/runs/$plan_name" \
        > "$work/logs/validate.log" 2>&1 \
        || { cat "$work/logs/validate.log" >&2; echo "converge.sh: the plan does not validate" >&2; exit 2; }
fi
[[ -z $check_only ]] || { echo "converge.sh: --check: the plan, rows $rows and models $models are valid"; exit 0; }
if [[ -f .gpu_resume/resume-$plan_name.tar.gz ]]; then
    mkdir -p "$work/runs/$plan_name" && tar -xzf ".gpu_resume/resume-$plan_name.tar.gz" -C "$work/runs/$plan_name"
    echo "converge.sh: resuming the models in .gpu_resume/resume-$plan_name.tar.gz"
fi
count=$(wc -w <<< "$models")
[[ -z $parallel ]] || (( parallel > count )) && parallel=$count
threads=$(( cpus / parallel )); (( threads < 1 )) && threads=1
# --foreground: timeout signals the trainer alone, once; without it a second SIGTERM, to timeout's process group,
# can reach the trainer while it saves and make it stop at once without its checkpoint. HYPERPLEX_TRITON=0 unless
# set: validation decoding then takes PyTorch's paths, so a model's run does not depend on the Triton kernel
# compiling on the machine (its own check is benchmarks/gpu/check.sh).
export HYPERPLEX_TRITON="${HYPERPLEX_TRITON:-0}"
# one model until the budget's end: with --compile on, once more without it if its compilation failed (and without
# it from the start when an earlier call into the same --work saw it fail: the same machine fails the same way)
fallback="converge.sh: torch.compile failed; starting again without it"
train_model() {
    local row=$1 seed=$2 log="$work/logs/$1-seed$2.log" mode=$compile rc left size
    [[ $mode == on ]] && grep -qF "$fallback" "$log" 2>/dev/null && mode=off
    while :; do
        left=$(( budget - ($(date +%s) - start) ))
        (( left >= 30 )) || return 124
        size=$(stat -c %s "$log" 2>/dev/null || echo 0)  # what this attempt writes starts after that
        # -k 20: on SIGTERM a trainer saves at the end of its step (seconds, a validation included); one that has
        # not exited by then is killed, so that collect still runs inside the call
        timeout --foreground -s TERM -k 20 "$left" "$python" -m hyperplex experiment "$plan" --rows "$row" \
            --seeds "$seed" --resume --evaluate-each --no-report --records "$work/records/$plan_name" \
            --out "$work/runs/$plan_name" --override=--training.device="$device" \
            --override=--training.num_threads="$threads" --override=--training.last_at_validation=false \
            --override=--training.compile="$([[ $mode == on ]] && echo true || echo false)" >> "$log" 2>&1
        rc=$?
        if (( rc != 0 )) && [[ $mode == on ]] \
                && grep -qF "training.compile: torch.compile failed" < <(tail -c +$(( size + 1 )) "$log"); then
            echo "converge.sh: $row:$seed: torch.compile failed (see its log); training it without compilation"
            echo "$fallback" >> "$log"
            mode=off
            continue
        fi
        return "$rc"
    done
}
echo "converge.sh: training through torch.compile: $compile; $parallel model(s) at a time, $threads thread(s) each"
running=0
for m in $models; do
    if (( running == parallel )); then
        wait -n; running=$(( running - 1 ))  # a slot is free as soon as any model ends
    fi
    if (( budget - ($(date +%s) - start) < 30 )); then
        echo "converge.sh: $m not started: under 30 s of the budget left"
        continue
    fi
    echo "converge.sh: $m started after $(( $(date +%s) - start )) s"
    train_model "${m%%:*}" "${m##*:}" &
    running=$(( running + 1 ))
done
wait
echo "converge.sh: all processes ended after $(( $(date +%s) - start )) s"
collect
