"""Shared fixtures. Models are built or prepared locally (nothing is downloaded) and cached."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Without CUDA the Triton kernel tests run under the interpreter, which Triton reads when it is first
# imported. Parts of transformers import Triton (its attention and mask registries, which the HF
# engine uses), so the variable is set here, before any test module is collected or run.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]
# Real GSM8K and MATH-500 files for the loader tests, where a developer has them: a folder holding
# gsm8k/test.jsonl and math500/test.jsonl, named by MENTOR_FAST_TEST_DATA (the tests skip without it).
TEST_DATA = os.environ.get("MENTOR_FAST_TEST_DATA", "")


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    from mentor_fast.models import resolve_model_path

    return resolve_model_path("tiny-llama")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from mentor_fast.models import resolve_model_path

    return resolve_model_path("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not TEST_DATA or not Path(TEST_DATA).is_dir():
        pytest.skip("set MENTOR_FAST_TEST_DATA to a folder with gsm8k/test.jsonl and math500/test.jsonl")
    return Path(TEST_DATA)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
