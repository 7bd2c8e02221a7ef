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
SHARED_DATA = REPO.parent / "shared" / "data"


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
    if not SHARED_DATA.is_dir():
        pytest.skip(f"reference data folder {SHARED_DATA} is absent")
    return SHARED_DATA


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
