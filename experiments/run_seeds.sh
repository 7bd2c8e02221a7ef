#!/usr/bin/env bash
# Runs the collapse experiment's arms seed by seed from a clean worktree of one commit, and commits the
# results file into this checkout after every arm, so a session cut short keeps each arm it finished and
# the next one goes on where it stopped (arm-seeds already in the results file are skipped).
#
#   bash experiments/run_seeds.sh COMMIT FIRST_SEED LAST_SEED ARMS RESULTS RUN_DIR [collapse.py flags...]
#   bash experiments/run_seeds.sh HEAD 0 7 vanilla,mentor,mentor_no_diagnosis,luffy,scaf \
#       experiments/results/baselines_math_seeds.json runs/seeds
#
# The worktree (RUN_DIR/code, at COMMIT) imports its own mentor_fast and kernels, not this checkout's, so
# work here does not change a run in flight; every row records the commit it ran at. Seeds run in order,
# and within a seed the arms in the order given (a seed's supervised and GRPO warm-ups are shared by its
# arms and cached in RUN_DIR). Needs the checkout's .venv.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -ge 6 ] || { sed -n '2,12p' "$0"; exit 2; }
COMMIT=$1 FIRST=$2 LAST=$3 ARMS=$4 RESULTS=$5 RUNS=$6
shift 6
PY="$ROOT/.venv/bin/python"
mkdir -p "$RUNS"
RUNS="$(cd "$RUNS" && pwd)"
CODE="$RUNS/code"
SHA="$(git -C "$ROOT" rev-parse "$COMMIT")"
if [ ! -d "$CODE" ]; then
    git -C "$ROOT" worktree add --detach "$CODE" "$SHA" >/dev/null
elif [ "$(git -C "$CODE" rev-parse HEAD)" != "$SHA" ]; then
    echo "run_seeds: $CODE is at $(git -C "$CODE" rev-parse --short HEAD), not $COMMIT; remove it or pass that commit" >&2
    exit 2
fi
# mentor_fast.kernels is kernels/ (pyproject's package-dir): a link makes the worktree's own importable
[ -e "$CODE/mentor_fast/kernels" ] || ln -s ../kernels "$CODE/mentor_fast/kernels"
done_already() {  # done_already SEED ARM: the results file has that arm-seed
    "$PY" - "$ROOT/$RESULTS" "$1" "$2" <<'EOF'
import json, sys
from pathlib import Path
p = Path(sys.argv[1])
arms = json.loads(p.read_text())["arms"] if p.exists() else {}
sys.exit(0 if sys.argv[2] in arms.get(sys.argv[3], {}).get("seeds", {}) else 1)
EOF
}
for seed in $(seq "$FIRST" "$LAST"); do
    for arm in ${ARMS//,/ }; do
        if done_already "$seed" "$arm"; then
            echo "run_seeds: seed $seed, $arm: in $RESULTS already"
            continue
        fi
        echo "run_seeds: seed $seed, $arm ($(date +%T))"
        (cd "$CODE" && PYTHONPATH="$CODE" "$PY" experiments/collapse.py --seeds $((seed + 1)) --first-seed "$seed" \
            --arms "$arm" --out "$RUNS" --reuse --results "$ROOT/$RESULTS" "$@")
        for try in 1 2 3 4 5 6; do  # another commit in this checkout may hold git's index lock
            git -C "$ROOT" add "$RESULTS" && git -C "$ROOT" commit -q -m "$(basename "$RESULTS"), seed $seed: $arm" \
                -- "$RESULTS" && break
            sleep 10
        done
    done
done
