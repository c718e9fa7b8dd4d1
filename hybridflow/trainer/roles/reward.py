"""The reward role: the reward worker (rule / custom function, reward model, generative judge), the checks that every
row can be scored, the stop tokens; and ``reward_model.*`` to the reward manager's arguments, as verl routes them.

In verl, ``reward_model.reward_kwargs`` are keyword arguments of the reward *manager*
(DAPO scripts pass ``overlong_buffer_cfg`` and ``max_resp_len`` there), while
``custom_reward_function.reward_kwargs`` are bound to the scoring function. A manager
that is not registered, or a ``reward_kwargs`` entry the chosen manager does not take,
is a config error found before any model loads.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

from hybridflow.errors import ConfigError
from hybridflow.models import load_causal_lm, load_reward_model, load_tokenizer
from hybridflow.models import load_config as load_model_config
from hybridflow.models.loader import import_external_lib
from hybridflow.rewards import RewardModelScorer, build_reward_manager, list_reward_managers, load_reward_function
from hybridflow.rewards.code_sandbox import apply_sandbox_settings
from hybridflow.rewards.generative_judge import DEFAULT_TEMPLATE, GenerativeJudge
from hybridflow.rewards.registry import check_rows_scorable
from hybridflow.rollout import SamplingParams
from hybridflow.rollout.engine import build_engine
from hybridflow.trainer.entry import resolve_device
from hybridflow.workers.reward import RewardWorker

VERL_MANAGER_KWARGS: dict[str, tuple[str, ...]] = {"dapo": ("overlong_buffer_cfg", "max_resp_len")}
"""``reward_model.reward_kwargs`` entries each manager takes (verl's constructor arguments)."""


def _as_dict(value: Any) -> dict:
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return dict(value or {})


def _dapo(cfg) -> dict[str, Any]:
    """verl's ``overlong_buffer_cfg`` / ``max_resp_len`` win over ``overlong_buffer`` / data.max_response_length."""
    rm, buffer = cfg.reward_model, cfg.reward_model.overlong_buffer
    verl_buffer = _as_dict(rm.reward_kwargs.get("overlong_buffer_cfg"))
    return {"max_response_length": rm.reward_kwargs.get("max_resp_len") or cfg.data.max_response_length,
            "overlong_buffer_len": verl_buffer.get("len", buffer.len),
            "penalty_factor": verl_buffer.get("penalty_factor", buffer.penalty_factor),
            "enable_overlong_buffer": verl_buffer.get("enable", buffer.enable)}


def _pool(cfg) -> dict[str, Any]:
    return {"num_workers": cfg.reward_model.num_workers}


MANAGER_SPECIFIC: dict[str, Callable[[Any], dict[str, Any]]] = {"parallel": _pool, "prime": _pool, "dapo": _dapo}
"""Keyword arguments only some reward managers take, by ``reward_model.reward_manager``."""


def _dapo_problems(cfg) -> list[str]:
    dapo = _dapo(cfg)
    if dapo["enable_overlong_buffer"] and not 0 < dapo["overlong_buffer_len"] <= dapo["max_response_length"]:
        return [f"the dapo overlong buffer length {dapo['overlong_buffer_len']} must be in (0, "
                f"max_resp_len={dapo['max_response_length']}]: set reward_model.overlong_buffer.len "
                "(or reward_kwargs.overlong_buffer_cfg.len)"]
    return []


MANAGER_CHECKS: dict[str, Callable[[Any], list[str]]] = {"dapo": _dapo_problems}
"""What only some reward managers check of the run config, by ``reward_model.reward_manager``."""


def reward_manager_kwargs(cfg) -> dict[str, Any]:
    """The arguments of ``build_reward_manager(cfg.reward_model.reward_manager, ...)`` besides the scorer."""
    rm = cfg.reward_model
    kwargs = {"reward_kwargs": dict(cfg.custom_reward_function.reward_kwargs) or None,
              "failure_score": rm.failure_score, "timeout_s": rm.timeout_s}
    kwargs.update(MANAGER_SPECIFIC.get(rm.reward_manager, lambda _: {})(cfg))
    return kwargs


def reward_manager_problems(cfg) -> list[str]:
    """An unregistered manager name, and ``reward_kwargs`` the manager does not take."""
    name = cfg.reward_model.reward_manager
    if name not in list_reward_managers():
        return [f"reward_model.reward_manager={name!r} is not one of {', '.join(list_reward_managers())}"]
    accepted = VERL_MANAGER_KWARGS.get(name, ())
    problems = [f"reward_model.reward_kwargs.{key} is not an argument of the {name!r} reward manager"
                f" (it takes: {', '.join(accepted) or 'none'}); keyword arguments of the scoring function go in"
                f" custom_reward_function.reward_kwargs.{key}"
                for key in cfg.reward_model.reward_kwargs if key not in accepted]
    if not problems:
        problems += MANAGER_CHECKS.get(name, lambda _: [])(cfg)
    return problems


def stop_token_ids(path: str, tokenizer) -> list[int]:
    """EOS of the tokenizer plus the model's generation-config EOS ids (chat models often have several)."""
    from transformers import GenerationConfig

    ids = {tokenizer.eos_token_id}
    try:
        eos = GenerationConfig.from_pretrained(os.path.expanduser(path)).eos_token_id
    except OSError:
        eos = None
    ids.update(eos if isinstance(eos, list) else [eos])
    return sorted(i for i in ids if i is not None)


def build_reward_worker(cfg, tokenizer):
    """The configured manager around the built-in scorers or ``custom_reward_function``."""
    rm = cfg.reward_model
    compute_score = None
    if cfg.custom_reward_function.path:
        compute_score = load_reward_function(cfg.custom_reward_function.path, cfg.custom_reward_function.name)
    manager = build_reward_manager(rm.reward_manager, compute_score=compute_score, **reward_manager_kwargs(cfg))
    model_scorer = None
    if rm.enable:
        model_scorer = build_generative_judge(cfg) if uses_generative_judge(cfg) else build_reward_model_scorer(cfg)
    return RewardWorker(manager=manager, tokenizer=tokenizer, reward_fn_key=cfg.data.reward_fn_key,
                        model_scorer=model_scorer,
                        stop_when_all_fail=rm.stop_when_all_fail)


def check_reward_inputs(cfg, loaders: dict[str, Any]) -> None:
    """Before any model loads: every row's data_source has a built-in scorer that can run here.

    Skipped for a custom reward function or a reward model (they decide what they need).
    """
    sandbox = cfg.reward_model.sandbox_fusion
    apply_sandbox_settings(allow_unsandboxed=sandbox.allow_unsandboxed, timeout_s=sandbox.timeout_s,
                           memory_mb=sandbox.memory_limit_mb)
    if cfg.custom_reward_function.path or cfg.reward_model.enable:
        return
    for files_key, loader in loaders.items():
        if hasattr(getattr(loader, "dataset", None), "reward_inputs"):  # a data.custom_cls may not have it
            check_rows_scorable(loader.dataset.reward_inputs(cfg.data.reward_fn_key), files=files_key,
                                reward_kwargs=dict(cfg.custom_reward_function.reward_kwargs))


def uses_generative_judge(cfg) -> bool:
    """``reward_model.use_reward_loop`` with a causal-LM model is a generative judge; a sequence
    classifier is scored directly (verl's reward loop serves both kinds)."""
    rm = cfg.reward_model
    if not (rm.use_reward_loop and rm.model.path):
        return False
    config = load_model_config(rm.model.path, trust_remote_code=rm.model.trust_remote_code)  # a bad path or type: one line
    return not any(name.endswith("ForSequenceClassification") for name in (config.architectures or []))


def build_generative_judge(cfg):
    """``reward_model.use_reward_loop``: a causal-LM judge generating verdicts through ``reward_model.rollout``."""
    rm = cfg.reward_model
    if not rm.model.path:
        raise ConfigError("reward_model.use_reward_loop=True needs reward_model.model.path (a causal LM judge)")
    tokenizer = load_tokenizer(rm.model.path, trust_remote_code=rm.model.trust_remote_code)
    model = load_causal_lm(rm.model.path, dtype="float32", trust_remote_code=rm.model.trust_remote_code)
    model = model.to(resolve_device(cfg.trainer.device)).eval()
    engine = build_engine(rm.rollout.name, model, tokenizer, **dict(rm.rollout.engine_kwargs))
    params = SamplingParams(n=1, temperature=rm.rollout.temperature, top_p=rm.rollout.top_p,
                            max_tokens=rm.rollout.response_length, stop_token_ids=stop_token_ids(rm.model.path, tokenizer),
                            seed=cfg.trainer.seed, logprobs=False)
    return GenerativeJudge(engine=engine, tokenizer=tokenizer, sampling_params=params,
                           template=rm.judge.prompt_template or DEFAULT_TEMPLATE, score_pattern=rm.judge.score_pattern,
                           score_scale=rm.judge.score_scale, failure_score=rm.failure_score,
                           timeout_s=rm.judge.timeout_s, max_prompt_length=rm.rollout.prompt_length)


def build_reward_model_scorer(cfg):
    """A sequence-classification reward model scoring (prompt, response) in its own chat template."""
    rm = cfg.reward_model
    if not rm.model.path:
        raise ConfigError("reward_model.enable=True needs reward_model.model.path (a sequence-classification model)")
    import_external_lib(rm.model.external_lib)
    tokenizer = load_tokenizer(rm.model.path, trust_remote_code=rm.model.trust_remote_code)
    model = load_reward_model(rm.model.path, trust_remote_code=rm.model.trust_remote_code,
                              pad_token_id=tokenizer.pad_token_id)
    return RewardModelScorer(model=model, tokenizer=tokenizer, max_length=rm.max_length,
                             micro_batch_size=rm.micro_batch_size_per_gpu or rm.micro_batch_size or 8)
