#!/usr/bin/env python
"""The one table of benchmarks/gpu_check.sh, from what its stages left in OUTDIR.

    python benchmarks/gpu_check_table.py OUTDIR MODE WALL_S BUDGET_S STEPS VLLM_STEPS HAVE_VLLM NAME=RC ...

Rows: the tests; the machine; the kernel table (per shape: time, x its floor, TFLOP/s, peak memory, the
fp64 check); the step against TRL (tokens/s and peak memory, and the targets: >= 4x TRL's tokens/s at no
more peak memory); the decode modes (tokens/s, x the eager loop; target >= 10x); the update (target <=
150 ms); MENTOR's re-roll cost; the 1.5B shape's steps; the fused-vs-reference training runs; the fused
run again (on the CPU the same run bit for bit, or the check fails; on a GPU the run-to-run spread, which
is reported, not failed: trainer.deterministic is off there by default); trainer.deterministic's cost on
the update, and whether it repeats the gradient bit for bit (on the CPU it must); vLLM's weight sync. A
stage that failed or left no result fails the check (exit 1); a target missed is said in its row and does not. Every figure's JSON and log stay in OUTDIR.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REL, ABS = 1e-4, 1e-6  # the fused-vs-reference training comparison (tests/test_gpu.py's, which says why)
SYNC_TARGET = 0.05  # the weight sync's share of a colocated step
TRL_TARGET, GEN_TARGET, UPDATE_TARGET_MS = 4.0, 10.0, 150.0


class Table:
    def __init__(self):
        self.rows: list[tuple[str, str, str]] = []
        self.failed: list[str] = []

    def add(self, what: str, result: str, detail: str = "", ok: bool = True) -> None:
        self.rows.append((what, result, detail))
        if not ok:
            self.failed.append(what)

    def missing(self, what: str, rc: str, log: str) -> None:
        skipped = rc in ("budget", "none")
        self.add(what, "skipped" if skipped else "no result", f"exit {rc} (see {log})", ok=rc == "none")


def load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def tests(t: Table, out: Path, rc: str, mode: str) -> None:
    for name, label in (("pytest.xml", "gpu-marked tests"), ("pytest_triton.xml", "Triton tests on CUDA")):
        if not (out / name).is_file():
            if name == "pytest.xml":
                t.missing(label, rc, "pytest.log")
            continue
        try:
            suites = ET.parse(out / name).getroot()
        except ET.ParseError as e:
            t.add(label, "no result", f"{type(e).__name__}", ok=False)
            continue
        suites = [suites] if suites.tag == "testsuite" else list(suites)
        n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
        passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
        bad = [c.get("classname", "").split(".")[-1] + "::" + c.get("name", "") for s in suites
               for c in s.iter("testcase") if c.find("failure") is not None or c.find("error") is not None]
        t.add(label, f"{passed} passed, {n['failures'] + n['errors']} failed, {n['skipped']} skipped",
              "failed: " + ", ".join(bad[:4]) if bad else f"exit {rc}", ok=not bad and (mode == "cpu" or passed > 0))


def kernels(t: Table, out: Path, rc: str) -> None:
    k = load(out / "kernels.json")
    if k is None:
        t.missing("kernel table", rc, "kernels.log")
        return
    m = k["machine"]
    t.add("machine", m["device"], f"torch {m['torch']}, CUDA {m['cuda']}, triton {m['triton']}, transformers "
          f"{m['transformers']}, liger-kernel {m['liger_kernel'] or '-'}, python {m['python']}")
    for run in k["runs"]:
        s = run["shape"]
        shape = f"N={s['n']} H={s['h']} V={s['v']}"
        for r in run["results"]:
            name = f"kernel {r['variant']}"
            if "median_ms" not in r:
                why = r.get("skipped") or r.get("error", "?")
                t.add(name, "skipped" if "skipped" in r else "ERROR", f"{shape}: {why}", ok="skipped" in r)
                continue
            xf = f"{r['x_floor']:.2f}x floor" if r.get("x_floor") else "-"
            tf = f"{r['tflops']:.0f} TFLOP/s" if r.get("tflops") and r["tflops"] > 1 else (
                f"{r['tflops']:.3g} TFLOP/s" if r.get("tflops") else "")
            mem = f"{r['peak_extra_mib'] / 1024:.2f} GiB peak" if r.get("peak_extra_mib") is not None else ""
            detail = shape + (f" | {r['inputs']}" if r.get("inputs") else "")
            if r.get("vs_fp64"):
                v = r["vs_fp64"]
                detail += (f" | vs fp64: max err dH {v['dH']['max_err']:.1e}, dW {v['dW']['max_err']:.1e} "
                           + ("within the rule" if r.get("within_tolerance") else "OUT OF TOLERANCE"))
            if r.get("error"):
                detail += f" | {r['error']}"
            t.add(name, ", ".join(filter(None, (f"{r['median_ms']:.2f} ms", xf, tf, mem))), detail, "error" not in r)
    if rc != "0":
        t.add("kernel table", f"exit {rc}", "see kernels.log", False)


def _step_row(t: Table, r: dict, what: str) -> None:
    if "error" in r:
        t.add(what, "no result", r["error"][-200:], ok=False)
        return
    m = r["median"]
    t.add(what, f"{m['tokens_per_s']:.0f} tok/s, step {m['step_s']:.2f} s, peak {r['peak_gb'] or 0:.2f} GiB",
          f"generation {m['gen_s']:.2f} s, update {m['update_s']:.2f} s (medians of steps 2..N)")


NAMES = {"ours": "step: mentor_fast", "trl": "step: TRL 1.16", "ours_gc": "step: ours, ckpt on",
         "mentor": "step: MENTOR"}


def step_trl(t: Table, out: Path, rc: str) -> None:
    g = load(out / "gpu_step_trl.json")
    if g is None:
        t.missing("step vs TRL", rc, "step_trl.log")
        return
    for r in g["results"]:
        _step_row(t, r, NAMES.get(r["name"], r["name"]))
    _mentor_ratio(t, g)
    for prefix, what in (("", "step vs TRL (defaults)"), ("gc_", "step vs TRL (ckpt on)")):
        ratio, mem = g["ratios"].get(prefix + "tokens_per_s_vs_trl"), g["ratios"].get(prefix + "peak_mem_vs_trl")
        if ratio is None:
            continue
        met = ratio >= TRL_TARGET and mem is not None and mem <= 1.0
        t.add(what, f"{ratio:.2f}x TRL's tokens/s, {mem or float('nan'):.2f}x its peak memory",
              f"target >= {TRL_TARGET:g}x at no more memory: {'met' if met else 'NOT met'} ({g['device']})")


def gen(t: Table, out: Path, rc: str) -> None:
    g = load(out / "gen.json")
    if g is None:
        t.missing("decode modes", rc, "gen.log")
        return
    for sec in g.get("sections", []):
        for r in sec.get("rows", []):
            if not r.get("steady_s"):
                continue
            x = r.get("x_loop")
            t.add(f"decode {sec['shape']} {r['row']}", f"{r['tokens_per_s']:.0f} tok/s"
                  + (f", {x:.1f}x the loop" if x else ""),
                  f"steady {r['steady_s']:.2f} s, first call {r['first_s']:.2f} s"
                  + (f" | target >= {GEN_TARGET:g}x: {'met' if x >= GEN_TARGET else 'NOT met'}"
                     if x and r["row"] == "static" and sec["shape"] == "0p5b" else ""))
        for name, why in sec.get("skipped", {}).items():
            t.add(f"decode {sec['shape']} {name}", "skipped", why)
    if g.get("failed"):
        t.add("decode checks", "FAILED", "; ".join(map(str, g["failed"]))[:300], ok=False)


def update(t: Table, out: Path, rc: str) -> None:
    u = load(out / "update.json")
    if u is None:
        t.missing("update", rc, "update.log")
        return
    for r in u["rows"]:
        if r.get("median_ms") is None:
            continue
        met = ""
        if r["variant"] == "defaults" and u["mode"] == "gpu":
            met = f" | target <= {UPDATE_TARGET_MS:g} ms: {'met' if r['median_ms'] <= UPDATE_TARGET_MS else 'NOT met'}"
        t.add(f"update {r['variant']} @{r['micro_batch_tokens']}", f"{r['median_ms']:.1f} ms"
              + (f", {r['speedup_vs_today']:.2f}x today" if r.get("speedup_vs_today") else ""),
              f"ckpt {r['checkpointing']}, {r['form']}, {r['micro_batches']} micro-batches"
              + (f", peak {r['peak_gb']:.2f} GiB" if r.get("peak_gb") else "") + met)


def step_more(t: Table, out: Path, rc: str) -> None:
    g = load(out / "gpu_step_more.json")
    if g is None:
        t.missing("MENTOR / 1.5B steps", rc, "step_more.log")
        return
    for r in g["results"]:
        if r["name"] == "big":
            if "error" in r:
                t.add("1.5B shape", "no result", r["error"][-200:], ok=False)
                continue
            for i, s in enumerate(r["steps_rows"], 1):
                shares = ", ".join(f"{k[:-2]} {s[k] / s['step_s']:.0%}" for k in s if k.endswith("_s")
                                   and k not in ("step_s", "tokens_per_s") and s[k])
                t.add(f"1.5B shape step {i}", f"{s['tokens_per_s']:.0f} tok/s, step {s['step_s']:.1f} s, "
                      f"peak {s['peak_gb'] or 0:.1f} GiB", shares)
        else:
            _step_row(t, r, NAMES.get(r["name"], r["name"]))
    _mentor_ratio(t, g)


def _mentor_ratio(t: Table, g: dict) -> None:
    if "mentor_step_vs_vanilla" in g["ratios"]:
        t.add("MENTOR's re-roll cost", f"{g['ratios']['mentor_step_vs_vanilla']:.2f}x vanilla's step time",
              "every group fails (random model): MENTOR's whole budget every step")


def metrics(out: Path, name: str) -> list[dict]:
    p = out / f"train_{name}_metrics.jsonl"
    return [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()] if p.is_file() else []


def training(t: Table, out: Path, rcs: dict, steps: int, mode: str) -> None:
    ref, fus = metrics(out, "reference"), metrics(out, "fused")
    if rcs["train_reference"] == "none" and rcs["train_fused"] == "none":
        return
    if rcs["train_reference"] != "0" or rcs["train_fused"] != "0" or len(ref) != steps or len(fus) != steps:
        t.add("training fused vs reference", "no comparison", f"exit {rcs['train_reference']}/{rcs['train_fused']}; "
              f"steps {len(ref)}/{len(fus)} of {steps}", rcs["train_reference"] == "budget")
        return
    bad, worst_rel, worst_abs = [], 0.0, 0.0
    for a, b in zip(ref, fus):
        if a.get("reward/mean") != b.get("reward/mean"):
            bad.append(f"step {a['step']} reward")
        for key in ("loss", "grad_norm", "entropy"):
            d = abs(b[key] - a[key])
            # a value near zero (the loss, whose advantages sum to zero in each group) has no relative error
            if abs(a[key]) > 1e3 * ABS:
                worst_rel = max(worst_rel, d / abs(a[key]))
            else:
                worst_abs = max(worst_abs, d)
            if d > ABS + REL * abs(a[key]):
                bad.append(f"step {a['step']} {key}")
    t.add("training fused vs reference", f"{steps} steps, worst diff {worst_rel:.1e} relative, {worst_abs:.1e} "
          f"absolute near 0",
          f"tiny model on {mode}; rel {REL:g} + abs {ABS:g}, the same samples each step"
          + (f" | FAIL: {', '.join(bad[:4])}" if bad else ""), not bad and ref[0]["grad_norm"] > 0)


def repeat(t: Table, out: Path, rcs: dict, steps: int, mode: str) -> None:
    """The fused run twice, the same command: every metric but the timings compared exactly (as
    experiments/same_run.py does). A difference fails the CPU check; on a GPU it is the spread."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import same_run  # here, not at the top: it needs the project, and the other rows of the table do not

    what = "training run to run (fused, same seed)"
    if rcs.get("train_fused_again", "none") == "none":
        return
    a, b = metrics(out, "fused"), metrics(out, "fused_again")
    if rcs["train_fused"] != "0" or rcs["train_fused_again"] != "0" or len(a) != steps or len(b) != steps:
        t.add(what, "no comparison", f"exit {rcs['train_fused']}/{rcs['train_fused_again']}; "
              f"steps {len(a)}/{len(b)} of {steps}", rcs["train_fused_again"] == "budget")
        return
    r = same_run.compare_rows(a, b)
    first, spread = r["first_step"], r["max_abs_diff"]
    setting = f"tiny model on {mode}; trainer.deterministic=auto ({'on' if mode == 'cpu' else 'off'} here)"
    if first is None and not r["first_keys"]:
        t.add(what, f"{steps} steps, every metric equal bit for bit", setting)
        return
    worst = ", ".join(f"{k} {spread[k]:.1e}" for k in ("loss", "grad_norm", "entropy", "reward/mean") if k in spread)
    t.add(what, f"part at step {first}: {', '.join(r['first_keys'][:4])}",
          f"{setting}; max |a - b| {worst or '-'}"
          + (" (the run-to-run spread)" if mode == "gpu" else " | FAIL: a CPU run must repeat bit for bit"),
          ok=mode == "gpu")


def determinism(t: Table, out: Path, rc: str, mode: str) -> None:
    """trainer.deterministic's cost on the update, and the distinct gradients of each setting over the
    same update repeated: with it on, more than one fails the CPU check (on a GPU it is reported)."""
    d = load(out / "determinism.json")
    if d is None:
        t.missing("trainer.deterministic: update", rc, "determinism.log")
        return
    off, on = d["rows"]["off"], d["rows"]["on"]
    ratio = f"{d['on_over_off']:.2f}x the update's time" if d.get("on_over_off") else "not timed"
    bad = on["distinct_gradients"] > 1
    t.add("trainer.deterministic: update", f"on: {ratio}",
          f"{d['model']}, {d['rollouts']} rollouts; distinct gradients off {off['distinct_gradients']} of "
          f"{off['calls']}, on {on['distinct_gradients']} of {on['calls']}"
          + (" | FAIL: on must repeat bit for bit" if bad and mode == "cpu" else " (not bit for bit on)" if bad else ""),
          ok=not (bad and mode == "cpu"))


def vllm(t: Table, out: Path, rc: str, have: bool, steps: int, mode: str) -> None:
    if not have:
        t.add("vllm colocate: weight sync", "skipped: vllm not installed", "runs where `import vllm` works")
        return
    rows = metrics(out, "vllm_colocate")
    fracs = sorted(r["perf/weight_sync_frac"] for r in rows if isinstance(r.get("perf/weight_sync_frac"), float))
    if rc != "0" or len(rows) != steps or not fracs:
        t.add("vllm colocate: weight sync", "no result", f"exit {rc}; {len(rows)} of {steps} steps", False)
        return
    frac = fracs[len(fracs) // 2]
    t.add("vllm colocate: weight sync", f"{100 * frac:.1f}% of the step",
          f"target < {SYNC_TARGET:.0%}: {'met' if frac < SYNC_TARGET else 'NOT met'}"
          + ("" if mode == "gpu" else " (a GPU target; shown for information on the CPU)"))


def main(argv: list[str]) -> int:
    out, mode, wall, budget, steps, vllm_steps, have_vllm = (Path(argv[0]), argv[1], int(argv[2]), int(argv[3]),
                                                             int(argv[4]), int(argv[5]), argv[6] == "1")
    rcs = dict(a.split("=", 1) for a in argv[7:])
    t = Table()
    if rcs["pytest"] != "none":
        tests(t, out, rcs["pytest"], mode)
    for name, fn in (("kernels", kernels), ("step_trl", step_trl), ("gen", gen), ("update", update),
                     ("step_more", step_more)):
        if rcs[name] != "none":
            fn(t, out, rcs[name])
    training(t, out, rcs, steps, mode)
    repeat(t, out, rcs, steps, mode)
    if rcs.get("determinism", "none") != "none":
        determinism(t, out, rcs["determinism"], mode)
    vllm(t, out, rcs["vllm_colocate"], have_vllm, vllm_steps, mode)
    w0, w1 = max(len(r[0]) for r in t.rows), min(60, max(len(r[1]) for r in t.rows))
    line = "-" * 150
    print(line)
    print(f"gpu_check ({mode} mode): {wall} s of a {budget} s budget, "
          + (f"FAILED: {', '.join(t.failed)}" if t.failed else "all passed"))
    print(line)
    for what, result, detail in t.rows:
        print(f"{what:{w0}s}  {result:{w1}s}  {detail}")
    print(line)
    print(f"logs and JSON: {out}")
    return 1 if t.failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 9:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1:]))
