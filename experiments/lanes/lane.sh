#!/usr/bin/env bash
# One resumable one-thread CPU lane over some models of a plan, trained one after another.
#
#   bash experiments/lanes/lane.sh PLAN_NAME ROW:SEED [ROW:SEED ...]
#
# Run it from a frozen copy of the repository (see experiments/lanes/README.md), so that the code a
# lane trains with does not change under it while the tree is being edited. Each model is trained
# with `hyperplex experiment experiments/PLAN_NAME.yaml --rows ROW --seeds SEED --resume` into
# runs/PLAN_NAME/ROW/seedSEED, evaluated as soon as it finishes, and recorded (config, logs, metrics,
# evaluation; no checkpoint) in experiments/records/PLAN_NAME/ROW/seedSEED. A finished or recorded
# model is skipped, an unfinished one resumes from its last checkpoint, so the same command can be
# started again after the machine or the session stopped. A model that fails is logged and the lane
# goes on with the next one; the exit status is 1 if any failed. SIGTERM or SIGINT to the lane stops it: the model
# in training gets SIGTERM (it saves a resumable checkpoint at the end of its step), the lane waits for it and
# exits (143 or 130) without starting the next model, so the same command resumes where it stopped. SIGINT only
# where the lane was started with SIGINT deliverable: a shell starts its background jobs with SIGINT ignored, and
# bash cannot trap a signal ignored on entry (experiments/retrain/lanes.sh starts its chains so and stops them by
# SIGTERM).
#
# Environment: HYPERPLEX_PYTHON (default: python3) is the interpreter that has hyperplex's
# dependencies; the package itself is taken from this copy's src/. HYPERPLEX_RECORDS_ALSO=DIR (e.g. the working
# tree's experiments/records): a model already recorded there, by a GPU session or another lane, is skipped too.
set -uo pipefail
if [[ $# -lt 2 ]]; then
    echo "usage: bash experiments/lanes/lane.sh PLAN_NAME ROW:SEED [ROW:SEED ...]" >&2
    exit 2
fi
cd "$(dirname "$0")/../.."
plan_name=$1; shift
plan="experiments/$plan_name.yaml"
[[ -f $plan ]] || { echo "lane: no plan file $plan (PLAN_NAME is the file's stem)" >&2; exit 2; }
python=${HYPERPLEX_PYTHON:-python3}
also=${HYPERPLEX_RECORDS_ALSO:-}
[[ -z $also || -d $also ]] || { echo "lane: HYPERPLEX_RECORDS_ALSO: no folder '$also'" >&2; exit 2; }
export PYTHONPATH="$PWD/src" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
failed=0
child="" stopped=""
# A background child with `wait` lets the trap run at once; TERM, not INT, is sent on, because a non-interactive
# shell starts background commands with SIGINT ignored.
stop() { stopped=$1; [[ -z $child ]] || kill -TERM "$child" 2>/dev/null; }
trap 'stop TERM' TERM
trap 'stop INT' INT
for model in "$@"; do
    [[ -z $stopped ]] || break
    row=${model%%:*}; seed=${model##*:}
    if [[ -z $row || -z $seed || $row == "$model" || ! $seed =~ ^[0-9]+$ ]]; then
        echo "lane: '$model' is not ROW:SEED (e.g. small_phm4:1)" >&2; failed=1; continue
    fi
    if [[ -n $also && -f $also/$plan_name/$row/seed$seed/record.json ]]; then
        echo "lane: $plan_name $row seed $seed is recorded in $also/$plan_name/$row/seed$seed: skipped"; continue
    fi
    echo "lane: $(date -u +%FT%TZ) start $plan_name $row seed $seed"
    "$python" -m hyperplex experiment "$plan" --rows "$row" --seeds "$seed" --resume --evaluate-each \
        --no-report --records "experiments/records/$plan_name" --out "runs/$plan_name" \
        --override=--training.num_threads=1 &
    child=$!
    [[ -z $stopped ]] || kill -TERM "$child" 2>/dev/null  # a signal that came before $! was known
    wait "$child"; status=$?
    while [[ -n $stopped ]] && kill -0 "$child" 2>/dev/null; do wait "$child"; status=$?; done
    child=""
    if [[ -n $stopped ]]; then
        echo "lane: $(date -u +%FT%TZ) stopped by SIG$stopped in $plan_name $row seed $seed; the same command resumes it" >&2
        break
    fi
    if (( status != 0 )); then
        echo "lane: $(date -u +%FT%TZ) FAILED $plan_name $row seed $seed" >&2; failed=1
    fi
    echo "lane: $(date -u +%FT%TZ) end $plan_name $row seed $seed"
done
[[ $stopped != TERM ]] || exit 143
[[ $stopped != INT ]] || exit 130
exit $failed
