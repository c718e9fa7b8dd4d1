from types import SimpleNamespace

from hybridflow.rollout import sampling_params_from_rollout_config


def rollout_cfg(**overrides):
    val = SimpleNamespace(n=1, temperature=0.0, top_p=1.0, top_k=-1, do_sample=False)
    base = dict(n=8, temperature=0.9, top_p=0.95, top_k=0, response_length=128, do_sample=True, val_kwargs=val)
    base.update(overrides)
    return SimpleNamespace(**base)


def test_training_keys_map_onto_sampling_params():
    params = sampling_params_from_rollout_config(rollout_cfg(), eos_token_id=2, seed=5)
    assert (params.n, params.temperature, params.top_p, params.top_k) == (8, 0.9, 0.95, -1)
    assert (params.max_tokens, params.stop_token_ids, params.seed) == (128, [2], 5)


def test_do_sample_false_is_greedy_and_top_k_passes_through():
    params = sampling_params_from_rollout_config(rollout_cfg(do_sample=False, top_k=20), eos_token_id=[2, 7])
    assert params.greedy and params.top_k == 20 and params.stop_token_ids == [2, 7]


def test_validate_reads_val_kwargs_but_keeps_response_length():
    cfg = rollout_cfg(val_kwargs=SimpleNamespace(n=4, temperature=0.6, top_p=0.9, top_k=50, do_sample=True))
    params = sampling_params_from_rollout_config(cfg, validate=True, eos_token_id=None)
    assert (params.n, params.temperature, params.top_p, params.top_k) == (4, 0.6, 0.9, 50)
    assert params.max_tokens == 128 and params.stop_token_ids == []
    greedy = sampling_params_from_rollout_config(rollout_cfg(), validate=True, eos_token_id=2)
    assert greedy.greedy and greedy.n == 1


def test_the_ppo_trainer_samples_through_the_same_mapping():
    """The loop has no copy of the mapping: top_k=0 (verl's HF-rollout 'off') reaches the engine as -1."""
    from hybridflow.config import PPOConfig, load_config
    from hybridflow.trainer.loop.generation import Generation

    cfg = load_config(PPOConfig, ["actor_rollout_ref.model.path=m", "data.train_files=t", "data.val_files=v",
                                  "actor_rollout_ref.rollout.top_k=0", "actor_rollout_ref.rollout.n=3",
                                  "actor_rollout_ref.rollout.val_kwargs.top_k=0"])
    generation = Generation(SimpleNamespace(cfg=cfg, workers=None, stop_token_ids=[2]))
    train = generation.sampling_params(step=3, validate=False)
    again = generation.sampling_params(step=3, validate=False)
    val = generation.sampling_params(step=3, validate=True)
    assert (train.n, train.top_k, train.stop_token_ids, train.logprobs) == (3, -1, [2], True)
    assert train.seed == again.seed and train.seed != val.seed and val.top_k == -1 and val.greedy


def test_ignore_eos_and_the_cuda_graph_keys_take_effect():
    """rollout.ignore_eos reaches the sampling; enforce_eager and cudagraph_capture_sizes reach the native engine
    (verl HEAD's default: graphs on)."""
    from hybridflow.config import PPOConfig, load_config
    from hybridflow.rollout.config import engine_kwargs_from_rollout_config

    assert sampling_params_from_rollout_config(rollout_cfg(ignore_eos=True), eos_token_id=2).ignore_eos
    assert not sampling_params_from_rollout_config(rollout_cfg(), eos_token_id=2).ignore_eos
    base = ["actor_rollout_ref.model.path=m", "data.train_files=t", "data.val_files=v"]
    default = engine_kwargs_from_rollout_config(load_config(PPOConfig, base).actor_rollout_ref.rollout)
    assert default["enforce_eager"] is False and default["cudagraph_capture_sizes"] is None
    cfg = load_config(PPOConfig, base + ["actor_rollout_ref.rollout.enforce_eager=True",
                                         "actor_rollout_ref.rollout.cudagraph_capture_sizes=[1,8,32]"])
    kwargs = engine_kwargs_from_rollout_config(cfg.actor_rollout_ref.rollout)
    assert kwargs["enforce_eager"] is True and list(kwargs["cudagraph_capture_sizes"]) == [1, 8, 32]


def test_ignore_eos_generates_past_the_stop_token(tiny_llama):
    from hybridflow.rollout import SamplingParams, build_engine
    from tests.rollout.conftest import chat_prompts

    model, tokenizer = tiny_llama
    prompts = chat_prompts(tokenizer)[:2]
    token = build_engine("native", model, tokenizer).generate(prompts, SamplingParams(temperature=0, max_tokens=3))
    stops = [c.token_ids[0] for c in token]  # make the first greedy token a stop token
    for name in ("native", "hf"):
        engine = build_engine(name, model, tokenizer)
        stopped = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=6, stop_token_ids=stops))
        assert all(len(c.token_ids) == 1 and c.finish_reason == "stop" for c in stopped)
        ignored = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=6, stop_token_ids=stops,
                                                          ignore_eos=True))
        assert all(len(c.token_ids) == 6 and c.finish_reason == "length" for c in ignored)
