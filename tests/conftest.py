"""Test-wide environment: caches in a temp dir, no hub, two threads in total."""

import os
import tempfile

_CACHE = tempfile.mkdtemp(prefix="hybridflow-test-cache-")
os.environ.setdefault("HF_HOME", os.path.join(_CACHE, "hf"))
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # spinning threads collapse on a shared 2-core machine
# fp32 on every CPU, as on an AVX2-only one, so pinned bits hold on AVX-512-BF16 too; bf16 tests opt in (issue 62).
os.environ.setdefault("HYBRIDFLOW_CPU_BF16", "0")

import pytest  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    # Triton kernels (the native engine's CUDA decode step) run in Triton's interpreter on CPU tensors:
    # slow, but the same kernels. Set before any kernel module is imported (the decorator reads it).
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    """A real HF fast tokenizer (byte-level BPE + ChatML template) saved to disk."""
    from hybridflow.models.tiny import build_tiny_tokenizer

    path = tmp_path_factory.mktemp("tiny_tokenizer")
    build_tiny_tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A randomly initialised 2-layer Llama-architecture checkpoint with the tiny tokenizer."""
    from hybridflow.models.tiny import save_tiny_model

    path = tmp_path_factory.mktemp("tiny_llama")
    save_tiny_model(str(path), arch="llama", seed=0)
    return str(path)


@pytest.fixture(params=["native-kernels", "portable-kernels"])
def kernel_path(request, monkeypatch):
    """Run a test on this CPU's fast path and on the forced portable fallback, so a green run on an
    AVX-512 machine means green on an AVX2-only one (and the other way round)."""
    from hybridflow.rollout.packed_linear import PORTABLE_KERNELS_ENV

    if request.param == "portable-kernels":
        monkeypatch.setenv(PORTABLE_KERNELS_ENV, "1")
    else:
        monkeypatch.delenv(PORTABLE_KERNELS_ENV, raising=False)
    return request.param


def pytest_runtest_setup(item):
    """A test against a real vLLM (marker ``vllm``) skips where neither this environment imports vllm nor the side
    venv ``.venv-vllm`` is ready (issue 56): ``make vllm-venv`` makes it (``make test-vllm`` does so first)."""
    if item.get_closest_marker("vllm") is None:
        return
    from hybridflow.rollout.optional import package_installed
    from hybridflow.rollout.vllm_venv import side_venv_dir, side_venv_ready

    if not package_installed("vllm") and not side_venv_ready():
        pytest.skip(f"no vLLM here and no side venv at {side_venv_dir()}: `make vllm-venv` makes it")
