"""Cross-field validation: one clear line per problem, before any model loads."""

import pytest

from hybridflow.config import PPOConfig, SFTConfig, critic_enabled, load_config, validate_ppo_config, validate_sft_config
from hybridflow.errors import ConfigError


@pytest.fixture
def files(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "train.parquet").write_bytes(b"x")
    (tmp_path / "test.parquet").write_bytes(b"x")
    return tmp_path


def ppo(files, *overrides):
    base = [
        f"actor_rollout_ref.model.path={files / 'model'}",
        f"data.train_files={files / 'train.parquet'}",
        f"data.val_files={files / 'test.parquet'}",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
    ]
    return load_config(PPOConfig, base + list(overrides))


def problems(cfg, **kwargs):
    with pytest.raises(ConfigError) as err:
        validate_ppo_config(cfg, **kwargs)
    return str(err.value).splitlines()


def test_valid_config_passes(files):
    validate_ppo_config(ppo(files), model_max_len=2048)


def test_train_batch_not_divisible_by_mini_batch(files):
    (line,) = problems(ppo(files, "actor_rollout_ref.actor.ppo_mini_batch_size=3"))
    assert line == (
        "data.train_batch_size=8 (x rollout.n=2) is not divisible by actor_rollout_ref.actor.ppo_mini_batch_size=3 "
        "(x rollout.n): make the mini-batch a divisor of the train batch"
    )


def test_mini_batch_not_divisible_by_micro_batch(files):
    (line,) = problems(ppo(files, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"))
    assert line == (
        "actor_rollout_ref.actor: mini-batch of 8 sequences per worker (ppo_mini_batch_size x rollout.n / "
        "1 workers) is not divisible by ppo_micro_batch_size_per_gpu=3"
    )


def test_mini_batch_not_divisible_by_data_parallel_size(files):
    lines = problems(ppo(files, "trainer.backend=ray", "trainer.n_gpus_per_node=3",
                         "algorithm.adv_estimator=grpo"))
    assert lines[0] == (
        "actor_rollout_ref.actor.ppo_mini_batch_size x rollout.n = 8 sequences is not divisible by the "
        "data-parallel size 3 (trainer.nnodes x trainer.n_gpus_per_node)"
    )
    assert "cannot be split evenly over 3 data-parallel workers" in lines[1]


def test_dynamic_batch_size_skips_micro_batch_check(files):
    validate_ppo_config(ppo(files, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
                            "actor_rollout_ref.actor.use_dynamic_bsz=True", "critic.use_dynamic_bsz=True"))


def test_context_length(files):
    (line,) = problems(ppo(files, "data.max_prompt_length=100", "data.max_response_length=50"), model_max_len=128)
    assert line == ("data.max_prompt_length + data.max_response_length = 150 exceeds the model's context of 128 "
                    "tokens: lower one of them")


def test_critic_required_iff_gae(files):
    (line,) = problems(ppo(files, "critic.enable=False"))
    assert line.startswith("algorithm.adv_estimator=gae needs a critic but critic.enable=False")
    assert critic_enabled(ppo(files)) is True
    assert critic_enabled(ppo(files, "algorithm.adv_estimator=grpo")) is False


def test_missing_model_and_files(files):
    cfg = ppo(files, f"actor_rollout_ref.model.path={files / 'nope'}", f"data.train_files={files / 'missing.parquet'}")
    lines = problems(cfg)
    assert lines[0] == f"actor_rollout_ref.model.path: model folder '{files / 'nope'}' does not exist (a hub id looks like org/name)"
    assert lines[1].startswith(f"data.train_files: file '{files / 'missing.parquet'}' does not exist")


def test_hub_id_is_not_checked_on_disk(files):
    validate_ppo_config(ppo(files, "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B"))


def test_enumerations_and_ranges(files):
    lines = problems(ppo(files, "data.truncation=middle_out", "trainer.resume_mode=sometimes",
                         "actor_rollout_ref.actor.clip_ratio_c=0.5", "actor_rollout_ref.rollout.top_p=0"))
    assert "data.truncation='middle_out' is not one of error, left, right, middle" in lines
    assert "actor_rollout_ref.actor.clip_ratio_c=0.5 must be > 1 (dual-clip bound)" in lines
    assert "actor_rollout_ref.rollout.top_p=0.0 must be in (0, 1]" in lines
    assert "trainer.resume_mode='sometimes' is not one of auto, disable, resume_path" in lines


@pytest.mark.parametrize("temperature", ["0", "-0.5"])
def test_training_rollouts_at_temperature_zero_are_refused(files, temperature):
    """The trainer scores each sampled token by softmax(logits / temperature): at 0 every loss was NaN and every
    update skipped, with a warning a step and nothing else; greedy sampling belongs to validation."""
    (line,) = problems(ppo(files, f"actor_rollout_ref.rollout.temperature={temperature}"))
    assert line.startswith(f"actor_rollout_ref.rollout.temperature={float(temperature)}: training rollouts are scored")
    assert "val_kwargs.temperature=0" in line
    validate_ppo_config(ppo(files, "actor_rollout_ref.rollout.val_kwargs.temperature=0"))


def test_resume_path_needs_a_path(files):
    (line,) = problems(ppo(files, "trainer.resume_mode=resume_path"))
    assert line == "trainer.resume_mode=resume_path needs trainer.resume_from_path=.../global_step_N"


def test_filter_groups_needs_metric(files):
    (line,) = problems(ppo(files, "algorithm.filter_groups.enable=True"))
    assert line.startswith("algorithm.filter_groups.enable=True needs algorithm.filter_groups.metric")


def test_sequence_parallel_needs_packed_rows(files):
    (line,) = problems(ppo(files, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                           "actor_rollout_ref.model.use_shared_prompt=False"))  # the padded layout
    assert line == ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 splits packed rows over ranks: "
                    "set actor_rollout_ref.model.use_remove_padding=True")
    validate_ppo_config(ppo(files, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                            "actor_rollout_ref.model.use_shared_prompt=False",
                            "actor_rollout_ref.model.use_remove_padding=True"))
    validate_ppo_config(ppo(files, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"))  # shared: packed


def test_sft_validation(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "t.parquet").write_bytes(b"x")
    cfg = load_config(SFTConfig, [f"model.partial_pretrain={tmp_path / 'm'}", f"data.train_files={tmp_path / 't.parquet'}",
                                  "data.train_batch_size=6", "data.micro_batch_size_per_gpu=4"])
    with pytest.raises(ConfigError) as err:
        validate_sft_config(cfg)
    assert str(err.value) == ("data.train_batch_size=6 is not divisible by 4 sequences per micro-batch x 1 "
                              "data-parallel workers (data.micro_batch_size_per_gpu, or data.micro_batch_size / workers)")
    cfg = load_config(SFTConfig, [f"data.train_files={tmp_path / 't.parquet'}"])
    with pytest.raises(ConfigError, match="model.partial_pretrain is not set"):
        validate_sft_config(cfg)


@pytest.mark.parametrize(
    "override, expected",
    [
        ("actor_rollout_ref.actor.optim.lr=-1", "actor_rollout_ref.actor.optim.lr=-1.0 must be a finite number >= 0"),
        ("actor_rollout_ref.actor.optim.lr=nan", "actor_rollout_ref.actor.optim.lr=nan must be a finite number >= 0"),
        ("actor_rollout_ref.actor.optim.lr=inf", "actor_rollout_ref.actor.optim.lr=inf must be a finite number >= 0"),
        ("actor_rollout_ref.actor.optim.eps=-1e-8", "actor_rollout_ref.actor.optim.eps=-1e-08 must be >= 0"),
        ("actor_rollout_ref.actor.optim.weight_decay=-0.1", "actor_rollout_ref.actor.optim.weight_decay=-0.1 must be >= 0"),
        ("actor_rollout_ref.actor.optim.betas=[0.9,1.5]", "actor_rollout_ref.actor.optim.betas=[0.9, 1.5] must be two numbers in [0, 1)"),
        ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=2", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=2.0 must be in [0, 1]"),
        ("critic.optim.lr=-1e-5", "critic.optim.lr=-1e-05 must be a finite number >= 0"),
        ("critic.optim.lr=-inf", "critic.optim.lr=-inf must be a finite number >= 0"),
    ],
)
def test_optimizer_settings_are_validated_with_the_config(files, override, expected):
    (line,) = problems(ppo(files, "algorithm.adv_estimator=gae", f"critic.model.path={files / 'model'}", override))
    assert line.startswith(expected)


@pytest.mark.parametrize("override", ["clip_ratio=-0.2", "clip_ratio_low=-0.1", "clip_ratio_high=nan",
                                      "clip_ratio=inf"])
def test_clip_ratios_must_be_finite_and_non_negative(files, override):
    """Issue 50: a negative clip_ratio reached the policy loss, whose AlgorithmError was a traceback."""
    name, value = override.split("=")
    (line,) = problems(ppo(files, f"actor_rollout_ref.actor.{override}"))
    assert line == (f"actor_rollout_ref.actor.{name}={float(value)} must be a finite number >= 0 (PPO's clip epsilon, "
                    "typically 0.2; DAPO's clip_ratio_high is 0.28)")


@pytest.mark.parametrize("limit", [0, -1, 23])
def test_a_sandbox_memory_limit_no_program_starts_under_is_refused(files, limit):
    """Issue 50: memory_limit_mb=0 scored every code sample 0 without a word."""
    (line,) = problems(ppo(files, f"reward_model.sandbox_fusion.memory_limit_mb={limit}"))
    assert line == (f"reward_model.sandbox_fusion.memory_limit_mb={limit} is too small for a Python program to start "
                    "(at least 24; the default is 1024): every code sample would score 0")
    validate_ppo_config(ppo(files, "reward_model.sandbox_fusion.memory_limit_mb=24"))


def test_sft_optimizer_settings_are_validated(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "train.parquet").write_bytes(b"x")
    cfg = load_config(SFTConfig, [f"model.partial_pretrain={tmp_path / 'model'}",
                                  f"data.train_files={tmp_path / 'train.parquet'}", "optim.lr=-1", "optim.clip_grad=0"])
    with pytest.raises(ConfigError) as err:
        validate_sft_config(cfg)
    assert str(err.value).splitlines() == ["optim.lr=-1.0 must be a finite number >= 0 (a typical RL learning rate is 1e-6)",
                                           "optim.clip_grad=0.0 must be > 0"]


def sft(tmp_path, *overrides):
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "t.parquet").write_bytes(b"x")
    return load_config(SFTConfig, [f"model.partial_pretrain={tmp_path / 'm'}", f"data.train_files={tmp_path / 't.parquet'}",
                                   "data.train_batch_size=16", *overrides])


def test_sft_global_micro_batch_size_is_split_over_ranks(tmp_path):
    """verl's deprecated ``data.micro_batch_size`` is global: 8 over 4 ranks = 2 per rank (not the default 4)."""
    from hybridflow.config.validate import sft_micro_batch_size_per_gpu

    cfg = sft(tmp_path, "data.micro_batch_size=8")
    assert sft_micro_batch_size_per_gpu(cfg.data, world_size=4) == 2
    assert sft_micro_batch_size_per_gpu(cfg.data, world_size=1) == 8
    assert sft_micro_batch_size_per_gpu(sft(tmp_path).data, world_size=4) == 4
    validate_sft_config(cfg, world_size=4)
    with pytest.raises(ConfigError, match=r"data.micro_batch_size=8 \(global\) is not divisible by the 3 data-parallel"):
        validate_sft_config(cfg, world_size=3)


def test_gen_batch_size_needs_dynamic_sampling(files):
    (line,) = problems(ppo(files, "data.gen_batch_size=24"))
    assert line.startswith("data.gen_batch_size=24 differs from data.train_batch_size=8 but "
                           "algorithm.filter_groups.enable=False")
    validate_ppo_config(ppo(files, "data.gen_batch_size=24", "algorithm.filter_groups.enable=True",
                            "algorithm.filter_groups.metric=acc"))
    validate_ppo_config(ppo(files, "data.gen_batch_size=8"))


def test_top_k_zero_is_off_and_negative_top_k_is_rejected(files):
    validate_ppo_config(ppo(files, "actor_rollout_ref.rollout.top_k=0", "actor_rollout_ref.rollout.val_kwargs.top_k=0",
                            "actor_rollout_ref.actor.use_rollout_log_probs=True"), model_max_len=2048)
    lines = problems(ppo(files, "actor_rollout_ref.rollout.top_k=-2", "actor_rollout_ref.rollout.val_kwargs.top_k=-5"))
    assert "actor_rollout_ref.rollout.top_k=-2 must be -1 or 0 (off) or a positive number of tokens" in lines
    assert "actor_rollout_ref.rollout.val_kwargs.top_k=-5 must be -1 or 0 (off) or a positive number of tokens" in lines
    (line,) = problems(ppo(files, "actor_rollout_ref.rollout.top_k=20", "actor_rollout_ref.actor.use_rollout_log_probs=True"))
    assert line.startswith("actor_rollout_ref.actor.use_rollout_log_probs=True needs rollout.top_p=1")


def test_an_estimator_that_needs_values_gets_a_critic_by_registering_only(files):
    """What an estimator needs is declared in algos/ when it registers; validation asks the spec, not the name."""
    from hybridflow.algos import advantage_spec, get_advantage, register_advantage

    @register_advantage("test_only_valued_estimator", needs_values=True)
    def valued(*, token_level_rewards, values, **_):
        return token_level_rewards - values, token_level_rewards

    cfg = ppo(files, "algorithm.adv_estimator=test_only_valued_estimator")
    assert critic_enabled(cfg) and advantage_spec("test_only_valued_estimator").needs_values
    assert get_advantage("test_only_valued_estimator") is valued
    lines = problems(ppo(files, "algorithm.adv_estimator=test_only_valued_estimator", "critic.enable=False"))
    assert lines[0].startswith("algorithm.adv_estimator=test_only_valued_estimator needs a critic but critic.enable=False")
    assert advantage_spec("remax").needs_greedy_baseline and not advantage_spec("grpo").needs_values
    assert advantage_spec(None) == type(advantage_spec("grpo"))()  # SPIN / SPPO: no estimator, nothing needed


def test_split_placement_needs_ray_and_a_batch_the_rollout_ranks_divide(files):
    (line,) = problems(ppo(files, "rollout.n_gpus_per_node=1", "trainer.backend=local"))
    assert "rollout.n_gpus_per_node=1 places the rollout in processes of its own, which needs trainer.backend=ray" in line
    (line,) = problems(ppo(files, "rollout.n_gpus_per_node=3", "trainer.backend=ray"))
    assert "data.train_batch_size=8 prompts cannot be split over the 3 rollout processes" in line
    (line,) = problems(ppo(files, "rollout.n_gpus_per_node=-1"))
    assert "n_gpus_per_node >= 0" in line
    validate_ppo_config(ppo(files, "rollout.n_gpus_per_node=2", "trainer.backend=ray"), model_max_len=2048)


def test_a_repetition_penalty_needs_engine_free_log_probs_and_must_be_positive(files):
    """The engine's log-probs are of the penalised distribution: the trainer cannot reuse them as the policy's."""
    (line,) = problems(ppo(files, "actor_rollout_ref.rollout.repetition_penalty=1.2",
                           "actor_rollout_ref.actor.use_rollout_log_probs=True"))
    assert "use_rollout_log_probs=True needs rollout.repetition_penalty=1" in line
    (line,) = problems(ppo(files, "actor_rollout_ref.rollout.repetition_penalty=0"))
    assert "repetition_penalty=0" in line and "must be > 0" in line
    validate_ppo_config(ppo(files, "actor_rollout_ref.rollout.repetition_penalty=1.2"), model_max_len=2048)


def test_a_checkpoint_folder_that_is_a_file_is_refused_before_loading(files, tmp_path):
    """Issue 50: a NotADirectoryError traceback when the first log was written, after the models loaded."""
    regular = tmp_path / "a_file"
    regular.write_text("x")
    (line,) = problems(ppo(files, f"trainer.default_local_dir={regular}"))
    assert line == (f"trainer.default_local_dir='{regular}' is a file, not a folder: point it at a folder (the run "
                    "writes its global_step_N checkpoints and logs there)")
    (line,) = problems(ppo(files, f"trainer.default_local_dir={regular}/run1/ckpt"))
    assert line.startswith(f"trainer.default_local_dir='{regular}/run1/ckpt' lies under the file '{regular}', not a "
                           "folder")
    with pytest.raises(ConfigError, match=f"^trainer.default_local_dir='{regular}' is a file"):
        validate_sft_config(sft(tmp_path, f"trainer.default_local_dir={regular}"))
    validate_ppo_config(ppo(files, f"trainer.default_local_dir={tmp_path / 'new' / 'folder'}"))  # created later
