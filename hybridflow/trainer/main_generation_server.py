"""``python -m hybridflow.trainer.main_generation_server +data.output_path=gen.parquet ...``: verl 0.9.1's
``verl.trainer.main_generation_server``: sample ``rollout.n`` responses to every prompt of ``data.train_files``
and write the rows back with a ``responses`` column (a list of n strings per row).

The same keys as verl (the PPO config): ``actor_rollout_ref.model.path``, ``data.train_files`` (rows whose
``data.prompt_key`` column holds chat messages), ``data.prompt_key``, ``rollout.n`` / ``temperature`` / ``top_p`` /
``response_length``, and ``data.output_path`` (verl passes it with ``+``). verl starts inference servers and posts
chat-completion requests to them; here the rollout engine (``actor_rollout_ref.rollout.name``) runs in this process
on the chat-templated prompts. ``python -m hybridflow.trainer.main_eval data.path=<output_path>`` then scores the file.
"""

from __future__ import annotations

import os
import sys

import pandas as pd

from hybridflow.config import PPOConfig, load_config, split_config_args
from hybridflow.config.validate import as_list
from hybridflow.errors import ConfigError, run_entry_point
from hybridflow.rollout import SamplingParams
from hybridflow.rollout.config import engine_kwargs_from_rollout_config
from hybridflow.rollout.engine import build_engine
from hybridflow.rollout.precision import cpu_engine_dtype
from hybridflow.trainer.roles.builders import load_policy, policy_tokenizer, rank_device
from hybridflow.trainer.roles.reward import stop_token_ids

OUTPUT_KEYS = ("+data.output_path=", "data.output_path=")


def split_output_path(args: list[str]) -> tuple[str, list[str]]:
    """(data.output_path, the other arguments): the one key verl's script reads beyond its PPO config."""
    paths = [arg.split("=", 1)[1] for arg in args if arg.startswith(OUTPUT_KEYS)]
    if len(paths) != 1:
        raise ConfigError("main_generation_server needs exactly one +data.output_path=FILE.parquet (where the "
                          "prompts and their responses are written)")
    return paths[0], [arg for arg in args if not arg.startswith(OUTPUT_KEYS)]


def read_prompts(cfg) -> pd.DataFrame:
    """The rows of every ``data.train_files`` parquet, in order (verl's concat)."""
    frames = [pd.read_parquet(os.path.expanduser(str(path))) for path in as_list(cfg.data.train_files)]
    frame = pd.concat(frames, axis=0, ignore_index=True)
    if cfg.data.prompt_key not in frame:
        raise ConfigError(f"data.prompt_key={cfg.data.prompt_key!r} is not a column of data.train_files "
                          f"(columns: {', '.join(frame.columns)})")
    return frame


def sampling_params(cfg, stop: list[int]) -> SamplingParams:
    """verl's request: n, temperature, top_p and max_tokens=response_length (top_k is not sent)."""
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.n < 1 or (rollout.temperature == 0.0 and rollout.n != 1):
        raise ConfigError(f"actor_rollout_ref.rollout.n={rollout.n} with temperature={rollout.temperature}: n must be "
                          ">= 1, and 1 when temperature=0 (greedy gives one answer)")
    return SamplingParams(n=rollout.n, temperature=rollout.temperature, top_p=rollout.top_p,
                          max_tokens=rollout.response_length, stop_token_ids=stop)


def generate(cfg, output_path: str) -> pd.DataFrame:
    """Sample the responses, write ``output_path`` (the rows plus ``responses``) and return the frame."""
    frame = read_prompts(cfg)
    tokenizer = policy_tokenizer(cfg)
    params = sampling_params(cfg, stop_token_ids(cfg.actor_rollout_ref.model.path, tokenizer))
    template_kwargs = dict(cfg.data.apply_chat_template_kwargs)
    prompts = [tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True, tokenize=True,
                                             return_dict=False, **template_kwargs)
               for messages in frame[cfg.data.prompt_key]]
    model = load_policy(cfg, rank_device()).eval()
    if next(model.parameters()).device.type == "cpu":
        model = model.to(cpu_engine_dtype(cfg.actor_rollout_ref.rollout.dtype))
    engine = build_engine(cfg.actor_rollout_ref.rollout.name, model, tokenizer,
                          **engine_kwargs_from_rollout_config(cfg.actor_rollout_ref.rollout))
    completions = engine.generate([list(ids) for ids in prompts], params)
    responses: list[list[str]] = [[] for _ in prompts]
    for completion in completions:
        responses[completion.prompt_index].append(tokenizer.decode(completion.token_ids, skip_special_tokens=True))
    frame["responses"] = responses
    os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
    frame.to_parquet(output_path)
    print(f"Saving results to {output_path}")
    return frame


def main(argv: list[str] | None = None) -> int:
    def run(args: list[str]) -> int:
        output_path, rest = split_output_path(args)
        config_file, overrides = split_config_args(rest)
        generate(load_config(PPOConfig, overrides, config_file), output_path)
        return 0

    return run_entry_point(run, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
