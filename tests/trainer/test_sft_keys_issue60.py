"""verl 0.9.1's SFT keys that were refused as "not implemented" (issue 60): each one changes what the SFT trainer
builds (tokenizer, config, LoRA, validation rows, chat template arguments, optimizer, schedule)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from hybridflow.config import SFTConfig, load_config
from hybridflow.models import load_causal_lm
from hybridflow.models.lora import apply_lora, save_adapter
from hybridflow.trainer.sft_trainer import build_dataset, build_tokenizer, build_train_state, load_model

TEMPLATE = ("{% if enable_thinking is defined %}THINK={{ enable_thinking }} {% endif %}"
            "{% if flavour is defined %}FLAVOUR={{ flavour }} {% endif %}"
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def sft(model_dir, *overrides):
    return load_config(SFTConfig, [f"model.partial_pretrain={model_dir}", *overrides])


@pytest.fixture
def rows_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": f"a{i}"}) + "\n" for i in range(6)))
    return str(path)


def test_tokenizer_path_hf_config_path_and_custom_chat_template(tiny_model_dir, tmp_path):
    tokenizer_dir, config_dir = tmp_path / "tok", tmp_path / "cfg"
    shutil.copytree(tiny_model_dir, tokenizer_dir)
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "MINE"}))
    (tokenizer_dir / "chat_template.jinja").write_text("MINE")
    config_dir.mkdir()
    hf = json.loads((tokenizer_dir / "config.json").read_text())
    (config_dir / "config.json").write_text(json.dumps({**hf, "rms_norm_eps": 0.123}))
    cfg = sft(tiny_model_dir, f"model.tokenizer_path={tokenizer_dir}", f"model.hf_config_path={config_dir}")
    assert build_tokenizer(cfg).chat_template == "MINE"
    assert load_model(cfg, device=torch.device("cpu")).config.rms_norm_eps == pytest.approx(0.123)
    plain = sft(tiny_model_dir)
    assert build_tokenizer(plain).chat_template != "MINE"
    assert load_model(plain, device=torch.device("cpu")).config.rms_norm_eps != pytest.approx(0.123)
    assert build_tokenizer(sft(tiny_model_dir, f"model.custom_chat_template='{TEMPLATE}'")).chat_template == TEMPLATE


def test_lora_adapter_path_continues_the_adapter(tiny_model_dir, tmp_path):
    torch.manual_seed(0)
    adapted = apply_lora(load_causal_lm(tiny_model_dir), rank=4, alpha=8, target_modules=["q_proj"])
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    save_adapter(adapted, str(tmp_path / "adapter"))
    model = load_model(sft(tiny_model_dir, f"model.lora_adapter_path={tmp_path / 'adapter'}"),
                       device=torch.device("cpu"))
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name and "q_proj" in name for name in trainable)
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, adapted(input_ids=ids).logits, atol=1e-5)


def test_exclude_modules_keeps_lora_off_them(tiny_model_dir):
    model = load_model(sft(tiny_model_dir, "model.lora_rank=4", "model.exclude_modules=[q_proj,k_proj]"),
                       device=torch.device("cpu"))
    names = [name for name, _ in model.named_parameters() if "lora_A" in name]
    assert names and not any("q_proj" in n or "k_proj" in n for n in names) and any("v_proj" in n for n in names)


def test_val_max_samples_limits_the_validation_rows_only(tiny_model_dir, rows_file):
    from hybridflow.trainer.sft_trainer import build_trainer

    cfg = sft(tiny_model_dir, f"data.train_files={rows_file}", f"data.val_files={rows_file}", "data.val_max_samples=2",
              "data.train_batch_size=2", "data.micro_batch_size_per_gpu=2", "trainer.logger=[]")
    trainer = build_trainer(cfg)
    assert len(trainer.val_dataset) == 2 and len(trainer.loader.dataset) == 6


@pytest.mark.parametrize("overrides,expected", [
    ((), ""), (("data.enable_thinking_default=none",), ""),
    (("data.enable_thinking_default=false",), "THINK=False"),
    (("+data.apply_chat_template_kwargs.flavour=salty",), "FLAVOUR=salty"),
])
def test_chat_template_arguments_reach_the_template(tiny_model_dir, rows_file, overrides, expected):
    cfg = sft(tiny_model_dir, f"data.chat_template='{TEMPLATE}'", *overrides)
    tokenizer = build_tokenizer(cfg)
    text = tokenizer.decode(build_dataset(cfg, rows_file, tokenizer)[0]["input_ids"])
    assert ("THINK=" in text or "FLAVOUR=" in text) == bool(expected)
    assert expected in text


def test_optimizer_class_and_overrides():
    cfg = load_config(SFTConfig, ["model.path=/m", "optim.optimizer=SGD", "optim.lr=0.1",
                                  "+optim.override_optimizer_config.momentum=0.5"])
    optimizer = build_train_state(cfg, torch.nn.Linear(2, 2), steps=10).optimizer
    assert type(optimizer) is torch.optim.SGD and optimizer.defaults["momentum"] == 0.5
    plain = build_train_state(load_config(SFTConfig, ["model.path=/m"]), torch.nn.Linear(2, 2), steps=10)
    assert type(plain.optimizer) is torch.optim.AdamW


def test_zero_indexed_step_shifts_the_warm_up():
    def lr_at_start(*overrides):
        cfg = load_config(SFTConfig, ["model.path=/m", "optim.lr=1.0", "optim.lr_warmup_steps=4", *overrides])
        return build_train_state(cfg, torch.nn.Linear(2, 2), steps=100).scheduler.get_last_lr()[0]

    assert lr_at_start() == pytest.approx(0.0)  # step 0 of 4 warm-up steps
    assert lr_at_start("optim.zero_indexed_step=False") == pytest.approx(1 / 4)  # counted from 1


def test_balance_batch_is_accepted_with_its_reason():
    from hybridflow.config.compat import warn_compat_keys
    from hybridflow.config.loader import compose

    lines = warn_compat_keys(compose(SFTConfig, ["model.path=/m", "trainer.balance_batch=True"]), SFTConfig)
    assert any(line.startswith("data.balance_dp_token=True") and "no effect" in line for line in lines)


def test_critic_hf_config_path_reads_the_critic_s_config_from_its_folder(tiny_model_dir, tmp_path):
    from hybridflow.config import PPOConfig
    from hybridflow.data.parallel import LOCAL
    from hybridflow.trainer.roles.builders import build_critic_worker

    config_dir = tmp_path / "cfg"
    config_dir.mkdir()
    hf = json.loads(open(f"{tiny_model_dir}/config.json").read())
    (config_dir / "config.json").write_text(json.dumps({**hf, "rms_norm_eps": 0.123}))

    def critic_eps(*overrides):
        cfg = load_config(PPOConfig, [f"actor_rollout_ref.model.path={tiny_model_dir}", "algorithm.adv_estimator=gae",
                                      *overrides])
        worker = build_critic_worker(LOCAL, cfg=cfg, total_steps=1)
        return worker.critic.state.model.config.rms_norm_eps

    assert critic_eps(f"critic.model.hf_config_path={config_dir}") == pytest.approx(0.123)
    assert critic_eps() != pytest.approx(0.123)
