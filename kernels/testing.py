"""Test helpers for the kernels (used by tests/test_kernels*.py and the benchmarks): the tolerance
rule and a batch builder that exercises every branch of the loss. Imports only torch."""

from __future__ import annotations

import torch


def rule_check(got, ref64, same_prec, atol: float = 1e-6, factor: float = 2.0) -> dict:
    """The tolerance rule on error distributions, as flash-attention's tests state it: the kernel's
    error against the float64 reference may be at most `factor` times torch's error at the same
    precision, on the largest element AND on the mean, each plus `atol`:

        max |got - ref64|  <= factor * max |same - ref64|  + atol
        mean |got - ref64| <= factor * mean |same - ref64| + atol

    Not element by element: torch happens to be exact on single elements where any other summation
    order is not, so a kernel as accurate as torch overall would fail there (issue: 2 of 2.6e5 dH
    entries in fp32, 7,092 dW entries of a bf16 head 180x more accurate than torch at its worst).
    The max catches one element far off; the mean catches an error spread thinly over all of them.
    Returns the statistics, which of the two bounds failed ("bad": [] when both hold) and the index
    of the kernel's worst element. Few temporaries of the input's size (dW can be [V, H])."""
    ref64 = ref64.detach().reshape(-1)
    err = torch.sub(got.detach().reshape(-1).to(ref64.device, torch.float64), ref64).abs_()  # never in place:
    base = torch.sub(same_prec.detach().reshape(-1).to(ref64.device, torch.float64), ref64).abs_()  # .to may alias
    n = max(err.numel(), 1)
    stats = {"max_err": float(err.max()) if err.numel() else 0.0, "mean_err": float(err.sum()) / n,
             "torch_max_err": float(base.max()) if base.numel() else 0.0, "torch_mean_err": float(base.sum()) / n,
             "worst": int(err.argmax()) if err.numel() else -1, "atol": atol, "factor": factor}
    stats["bad"] = [k for k in ("max", "mean")
                    if stats[f"{k}_err"] > factor * stats[f"torch_{k}_err"] + atol]
    return stats


def assert_close_rule(name: str, got, ref64, same_prec, atol: float = 1e-6, factor: float = 2.0) -> None:
    """rule_check, asserted: prints the max and mean error of both and, on failure, which bound
    failed and the kernel's worst element, so a failure says where and by how much."""
    s = rule_check(got, ref64, same_prec, atol, factor)
    msg = (f"{name}: max err {s['max_err']:.3e} mean {s['mean_err']:.3e} | same-precision torch "
           f"max {s['torch_max_err']:.3e} mean {s['torch_mean_err']:.3e} | atol {atol:.1e}")
    if s["bad"]:
        i = s["worst"]
        g, r, t = (x.detach().reshape(-1)[i].item() for x in (got, ref64, same_prec))
        raise AssertionError(f"{msg} | over {factor:g}x torch on the {' and the '.join(s['bad'])}; worst element "
                             f"{i}: got {g:.8g} ref {r:.8g} torch {t:.8g}")
    print(msg)


def tiny_atol(dtype: torch.dtype, ref) -> float:
    """The rule's "tiny atol": a few units in the last place of the largest reference element, in the
    output precision (fp32: ~8 ulps; bf16/fp16 outputs: ~1 ulp), so a value whose torch twin happens
    to round exactly does not fail on rounding noise alone."""
    scale = float(ref.detach().abs().max()) if ref.numel() else 0.0
    return (1e-6 if dtype == torch.float32 else 4e-3) * scale + 1e-12


def make_batch(n: int, h: int, v: int, *, seqs: int = 8, seed: int = 0, temperature: float = 1.0,
               logit_scale: float = 1.0):
    """A packed GRPO batch that exercises every branch of the loss (tokens inside and outside the
    clip range on both sides, A = 0, a fully masked sequence, ragged weights, a target in the last
    vocab position). Returns a dict of fp64 tensors (hidden, weight) and fp32 per-token inputs."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64) * logit_scale
    weight = torch.randn(v, h, generator=g, dtype=torch.float64) / h**0.5 * 3.0
    targets = torch.randint(0, v, (n,), generator=g)
    targets[-1] = v - 1  # a target in the last (partial) vocab block
    targets[n // 2] = v - 2
    seq_ids = torch.sort(torch.randint(0, seqs, (n,), generator=g)).values
    with torch.no_grad():
        logp = torch.log_softmax(hidden @ weight.T / temperature, -1).gather(1, targets[:, None])[:, 0]
    # old log-probs: ratios spread over [e^-0.6, e^0.6] so both clips and the interior are hit
    old = (logp - (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 1.2).float()
    rewards = (torch.rand(seqs, generator=g) < 0.5).float()
    rewards[:4] = 1.0  # group 0 (sequences 0-3) all-equal rewards -> A = 0
    group_ids = torch.arange(seqs) // 4
    adv_seq = torch.randn(seqs, generator=g)
    adv_seq[0] = 0.0
    adv = adv_seq[seq_ids]
    weights = torch.rand(n, generator=g) / n
    weights[seq_ids == seqs - 1] = 0.0  # a fully masked sequence
    weights[::7] = 0.0  # ragged padding positions
    ref = (logp + torch.randn(n, generator=g, dtype=torch.float64) * 0.3).float()
    return {"hidden": hidden, "weight": weight, "targets": targets, "old_logp": old, "advantages": adv,
                "token_weights": weights, "ref_logp": ref, "seq_ids": seq_ids, "rewards": rewards, "group_ids": group_ids}


# The loss variants every kernel test draws from (by name): each hits a branch of the objective.
LOSS_CASES: dict[str, dict] = {
    "base": {},
    "temperature_dual_clip": {"temperature": 0.7, "dual_clip": 3.0},
    "temperature_dual_clip_k3": {"temperature": 0.7, "dual_clip": 3.0, "beta": 0.1, "kl_estimator": "k3"},
    "k1_beta": {"beta": 0.1, "kl_estimator": "k1"},
    "k3_beta": {"beta": 0.1, "kl_estimator": "k3"},
    "k2_beta_entropy_bonus": {"beta": 0.05, "kl_estimator": "k2", "entropy_coef": 0.02},
    "k1_cold": {"beta": 0.1, "kl_estimator": "k1", "temperature": 0.7},  # KL at temperatures on both sides of 1
    "k2_hot": {"beta": 0.05, "kl_estimator": "k2", "temperature": 1.3},
    "k3_cold": {"beta": 0.1, "kl_estimator": "k3", "temperature": 0.7},
    "is_weights": {"is_weights": True},
    "entropy_bonus_is_k2": {"entropy_coef": 0.02, "beta": 0.05, "kl_estimator": "k2", "is_weights": True},
    "gspo": {"type": "gspo"},
    "gspo_entropy_bonus": {"type": "gspo", "entropy_coef": 0.02},
    "cispo": {"type": "cispo", "cispo_cap": 1.2},
    "cispo_is_k1": {"type": "cispo", "cispo_cap": 1.2, "is_weights": True, "beta": 0.1, "kl_estimator": "k1"},
    "sapo_k3_beta": {"type": "sapo", "beta": 0.1, "kl_estimator": "k3"},
    "sapo_k3_cold": {"type": "sapo", "beta": 0.1, "kl_estimator": "k3", "temperature": 0.8},
    "fused_k0_rewards": {"rewards": True},
    # the sampler/trainer mismatch correction (kernels/mismatch.py), each mode; ratios exp(+-1.2)
    "is_token_truncate": {"is_mode": "token_truncate", "is_cap": 2.0, "sampler": True},
    "is_token_mask_two_sided": {"is_mode": "token_mask", "is_cap": 1.5, "is_floor": 0.5, "sampler": True},
    "is_sequence_truncate": {"is_mode": "sequence_truncate", "is_cap": 3.0, "is_floor": 0.5, "sampler": True},
    "is_sequence_mask_gspo": {"type": "gspo", "is_mode": "sequence_mask", "is_cap": 3.0, "sampler": True},
}


def loss_kwargs(b: dict, case: str) -> dict:
    """The keyword arguments of grpo_loss / grpo_loss_ref for LOSS_CASES[case] on the batch `b`
    (make_batch's): the reference log-probs when beta > 0, IS weights spread over [0.5, 1.6],
    sequence ids for gspo, rewards and group ids in place of advantages for K0, a sampler's log-probs
    for the mismatch correction."""
    kw = dict(LOSS_CASES[case])
    if "beta" in kw:
        kw["ref_logp"] = b["ref_logp"]
    if kw.pop("is_weights", False):
        kw["is_weights"] = torch.linspace(0.5, 1.6, b["targets"].numel(), device=b["targets"].device)
    if kw.get("type") == "gspo":
        kw["seq_ids"] = b["seq_ids"]
    if kw.pop("rewards", False):
        kw.update(rewards=b["rewards"], seq_ids=b["seq_ids"], group_ids=b["group_ids"])
    if kw.pop("sampler", False):
        kw.update(sampler_logp=sampler_logp(b), seq_ids=b["seq_ids"])
    return kw


def sampler_logp(b: dict) -> torch.Tensor:
    """A sampler's log-probs for make_batch's tokens: pi_old shifted by up to +-1.2 nats per token, so
    that token ratios fall on both sides of every bound the cases use, plus a drift that grows with
    the sequence id, so that some sequences' products stay inside [0.5, 3] and others leave it."""
    n = b["old_logp"].numel()
    seq = b["seq_ids"].cpu().float()
    shift = 1.2 * torch.sin(torch.arange(n, dtype=torch.float32) * 0.7) + 0.05 * (seq - seq.max() / 2)
    return (b["old_logp"] - shift.to(b["old_logp"].device)).float()


def case_temperature(case: str) -> float:
    return LOSS_CASES[case].get("temperature", 1.0)


def run_loss(fn, b: dict, dtype: torch.dtype, *, with_dw: bool = True, **kw):
    """Calls fn (grpo_loss or grpo_loss_ref) with hidden/weight cast to dtype and returns
    (output, dH, dW) with the gradients from loss.backward()."""
    hid = b["hidden"].detach().to(dtype).requires_grad_()
    w = b["weight"].detach().to(dtype).requires_grad_(with_dw)
    args = {k: b[k] for k in ("old_logp", "advantages", "token_weights")}
    out = fn(hid, w, b["targets"], **args, **kw)
    out.loss.backward()
    return out, hid.grad, w.grad
