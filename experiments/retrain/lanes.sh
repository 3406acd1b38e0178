#!/usr/bin/env bash
# The two CPU lanes of the re-trainings listed in README.md, on this machine.
#
#   bash experiments/retrain/lanes.sh start     # export the frozen copies that are missing, start both chains
#   bash experiments/retrain/lanes.sh status    # where each chain is
#   bash experiments/retrain/lanes.sh collect   # copy finished models into experiments/retrain (then commit them)
#   bash experiments/retrain/lanes.sh stop      # SIGTERM: each model saves a resumable checkpoint, the chains exit
#   bash experiments/retrain/lanes.sh list      # every model of both chains, one "CHAIN COMMIT PLAN ROW:SEED" a line
#
# Each chain runs experiments/lanes/lane.sh over its lists one after another, each list in its frozen copy
# /work/lanes/code-COMMIT (an export of COMMIT with the plan's old records removed from the export only, so that
# the lane trains every model again). Models recorded in experiments/retrain are skipped (HYPERPLEX_RECORDS_ALSO),
# so on a new machine `start` trains only what is not there; unfinished models resume from their checkpoints
# while the machine lasts. LANES (default /work/lanes) and HYPERPLEX_DATA (default ../shared/data beside the
# checkout) may be set.
set -uo pipefail
cd "$(dirname "$0")/../.."
checkout=$PWD
lanes=${LANES:-/work/lanes}
data=${HYPERPLEX_DATA:-$(cd .. && pwd)/shared/data}
python=${HYPERPLEX_PYTHON:-$checkout/.venv/bin/python}

# One list per line, "COMMIT PLAN ROW:SEED ROW:SEED ...", balanced so that the two chains take about the same
# time; each plan listed here has its row in README.md's table. Empty: no re-training is queued.
chain_a=(
)
chain_b=(
)

export_copy() {  # COMMIT: the frozen copy, with the old records of every plan re-trained from it removed from it
    local copy=$lanes/code-$1 step commit plan
    [[ ! -d $copy ]] || return 0  # an existing copy's records are the lanes' new ones: never removed
    rm -rf "$copy.partial" && mkdir -p "$copy.partial" && git archive "$1" | tar -x -C "$copy.partial" \
        || { echo "lanes.sh: could not export $1 into $copy" >&2; exit 1; }
    for step in "${chain_a[@]}" "${chain_b[@]}"; do
        read -r commit plan _ <<< "$step"
        [[ $commit != "$1" ]] || rm -rf "$copy.partial"/experiments/records/"$plan"/*/seed*
    done
    mv "$copy.partial" "$copy" && echo "lanes.sh: exported $1 into $copy"
}

run_chain() {  # NAME LIST...
    local name=$1 step commit plan models status; shift
    for step in "$@"; do
        read -r commit plan models <<< "$step"
        (cd "$lanes/code-$commit" && bash experiments/lanes/lane.sh "$plan" $models); status=$?
        if (( status == 143 || status == 130 )); then echo "chain-$name: stopped in code-$commit $plan"; exit "$status"; fi
    done
    echo "chain-$name: every list done"
}

case ${1:-} in
start)
    [[ -x $python ]] || { echo "lanes.sh: no interpreter $python (set HYPERPLEX_PYTHON, or make .venv)" >&2; exit 2; }
    [[ -d $data ]] || { echo "lanes.sh: no data folder $data (set HYPERPLEX_DATA)" >&2; exit 2; }
    (( ${#chain_a[@]} + ${#chain_b[@]} )) || { echo "lanes.sh: no re-training is queued (the chains are empty)"; exit 0; }
    if pgrep -f "experiments/lanes/lane.sh" > /dev/null; then echo "lanes.sh: lanes are running already" >&2; exit 1; fi
    mkdir -p "$lanes"
    for step in "${chain_a[@]}" "${chain_b[@]}"; do read -r commit _ <<< "$step"; export_copy "$commit"; done
    export HYPERPLEX_PYTHON=$python HYPERPLEX_DATA=$data HYPERPLEX_RECORDS_ALSO=$checkout/experiments/retrain
    (run_chain a "${chain_a[@]}" >> "$lanes/chain-a.log" 2>&1 &)
    (run_chain b "${chain_b[@]}" >> "$lanes/chain-b.log" 2>&1 &)
    echo "lanes.sh: started; logs $lanes/chain-a.log and chain-b.log"
    ;;
stop)
    pkill -TERM -f "experiments/lanes/lane.sh" && echo "lanes.sh: SIGTERM sent; the models save their checkpoints" \
        || echo "lanes.sh: no lane running"
    ;;
status)
    for name in a b; do
        log=$lanes/chain-$name.log
        [[ -f $log ]] || { echo "chain-$name: no log"; continue; }
        echo "chain-$name: $(grep -E '^lane: .* (start|end|FAILED|stopped)' "$log" | tail -n 1)"
        echo "  $(grep -E 'step [0-9]+' "$log" | tail -n 1)"
    done
    ;;
collect)
    for step in "${chain_a[@]}" "${chain_b[@]}"; do read -r commit plan _ <<< "$step"; echo "$commit $plan"; done \
        | sort -u | while read -r commit plan; do
            [[ ! -d $lanes/code-$commit ]] \
                || bash experiments/lanes/collect.sh --into experiments/retrain "$lanes/code-$commit" "$plan"
        done
    ;;
list)
    for step in "${chain_a[@]}"; do read -r commit plan models <<< "$step"; for m in $models; do echo "a $commit $plan $m"; done; done
    for step in "${chain_b[@]}"; do read -r commit plan models <<< "$step"; for m in $models; do echo "b $commit $plan $m"; done; done
    ;;
*)
    echo "usage: bash experiments/retrain/lanes.sh start|status|collect|stop|list" >&2; exit 2
    ;;
esac
