"""Liger-Kernel's patches on the policy (model.liger). Their kernels are Triton GPU kernels (they do
not run under the Triton interpreter), so on the CPU what is checked is the choice (auto applies
them only where they run, true fails naming the key) and that the patch reaches every RMSNorm and
MLP of the instance; tests/test_gpu.py compares the patched model's numbers on a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mentor_fast.models import ModelError, apply_liger, load_policy

pytest.importorskip("liger_kernel", reason="needs liger-kernel (pip install liger-kernel)")


def test_auto_leaves_a_cpu_policy_alone_and_on_names_the_key(tiny_model_path):
    model = load_policy(tiny_model_path)
    assert apply_liger(model, "auto", torch.device("cpu")) is False
    assert apply_liger(model, False, torch.device("cuda")) is False
    assert model.model.norm._get_name() == "LlamaRMSNorm"
    with pytest.raises(ModelError, match=r"model\.liger=true: .*Triton GPU kernels"):
        apply_liger(model, True, torch.device("cpu"))


def test_the_patch_reaches_every_norm_and_mlp_of_the_instance(tiny_model_path):
    # in a subprocess: Liger also patches transformers' Llama module globally (RoPE, the classes)
    code = f"""
from mentor_fast.models import load_policy, patch_liger
m = load_policy({str(tiny_model_path)!r})
patch_liger(m)
names = {{mod._get_name() for name, mod in m.named_modules() if name.endswith(("norm", "layernorm", "mlp"))}}
print(sorted(names))
"""
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "['LigerRMSNorm', 'LigerSwiGLUMLP']"


def test_the_key_reads_yaml_booleans():
    from mentor_fast.config import ConfigError, load_config

    assert load_config([], ["model.liger=false"]).model.liger is False  # YAML's off and no are false too
    assert load_config([], ["model.liger=true"]).model.liger is True
    assert load_config([], []).model.liger == "auto"
    with pytest.raises(ConfigError, match="model.liger"):
        load_config([], ["model.liger=sometimes"])
