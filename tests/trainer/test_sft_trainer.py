"""The SFT trainer end to end on the tiny model: loss mask, learning, invariances, resume, export, LoRA."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from hybridflow.config import SFTConfig, load_config
from hybridflow.errors import ConfigError
from hybridflow.trainer.checkpoints.manager import TRACKER_FILE
from hybridflow.trainer.sft_trainer import build_trainer, main, make_tracking

SUMS = [(1, 2), (3, 4), (5, 6), (7, 8), (2, 9), (4, 4), (6, 1), (9, 9)]
CONVERSATIONS = [
    [{"role": "system", "content": "you are helpful"},
     {"role": "user", "content": "what is 2 + 3?"},
     {"role": "assistant", "content": "2 + 3 = 5"},
     {"role": "user", "content": "and times 2?"},
     {"role": "assistant", "content": "5 * 2 = 10. #### 10"}],
    [{"role": "user", "content": "compute 7 + 1"},
     {"role": "assistant", "content": "the answer is 8"}],
]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The tiny model's matmuls are too small to share out: on busy shared cores a second OpenMP thread only
    adds synchronisation stalls (measured 1.4 s vs 6-26 s for 12 steps), so this module runs on one."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return str(path)


@pytest.fixture
def sums_file(tmp_path):
    rows = [{"question": f"what is {a} + {b}?", "answer": f"{a} + {b} = {a + b}"} for a, b in SUMS]
    return _write_jsonl(tmp_path / "sums.jsonl", rows)


def _cfg(tmp_path, model_dir, train_file, *extra, run="run"):
    overrides = [f"model.partial_pretrain={model_dir}", f"data.train_files={train_file}",
                 f"trainer.default_local_dir={tmp_path / run}", "trainer.logger=[]", "data.train_batch_size=4",
                 "data.micro_batch_size_per_gpu=2", "optim.lr=1e-3", "optim.weight_decay=0.0",
                 "optim.warmup_steps_ratio=0.0", "optim.lr_scheduler=constant", "trainer.total_training_steps=1",
                 *extra]
    return load_config(SFTConfig, overrides)


def _train(cfg):
    """Build and fit; the history comes from a real Tracking with no backends (trainer.logger=[])."""
    trainer = build_trainer(cfg)
    return trainer, trainer.fit(make_tracking(cfg))


def _weights(model):
    return {name: param.detach().clone() for name, param in model.named_parameters()}


# ---------------------------------------------------------------- loss mask
def _pieces_ids_and_targets(tokenizer, messages):
    """ChatML rendered piece by piece: target pieces are each assistant content and its <|im_end|>."""
    ids, targets = [], []
    for message in messages:
        role_ids = tokenizer.encode("<|im_start|>" + message["role"] + "\n", add_special_tokens=False)
        ids += role_ids
        targets += [0] * len(role_ids)
        body = tokenizer.encode(message["content"] + "<|im_end|>", add_special_tokens=False)
        ids += body
        targets += [int(message["role"] == "assistant")] * len(body)
        newline = tokenizer.encode("\n", add_special_tokens=False)
        ids += newline
        targets += [0] * len(newline)
    return ids, targets


def test_loss_is_ce_over_exactly_the_assistant_tokens(tmp_path, tiny_model_dir):
    data = _write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in CONVERSATIONS])
    cfg = _cfg(tmp_path, tiny_model_dir, data, "data.multiturn.enable=True", "data.train_batch_size=2",
               "data.micro_batch_size_per_gpu=1", "data.shuffle=False")
    trainer = build_trainer(cfg)
    expected_model = _weights(trainer.model)
    nll, count = 0.0, 0
    for messages in CONVERSATIONS:
        ids, targets = _pieces_ids_and_targets(trainer.tokenizer, messages)
        assert sum(targets) > 0 and targets[0] == 0
        with torch.no_grad():
            logits = trainer.model(input_ids=torch.tensor([ids])).logits[0]
        per_token = F.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="none")
        mask = torch.tensor(targets[1:], dtype=torch.bool)
        nll += per_token[mask].sum().item()
        count += int(mask.sum())
    metrics = trainer.train_step(list(trainer.loader.dataset.samples))
    assert metrics["train/num_target_tokens"] == count
    assert metrics["train/loss"] == pytest.approx(nll / count, rel=1e-5)
    assert any(not torch.equal(expected_model[n], p) for n, p in trainer.model.named_parameters())


# ---------------------------------------------------------------- learning and invariances
def test_loss_decreases_on_a_memorisable_dataset(tmp_path, tiny_model_dir, sums_file):
    cfg = _cfg(tmp_path, tiny_model_dir, sums_file, "trainer.total_training_steps=12", "optim.lr=3e-3")
    _, history = _train(cfg)
    losses = [row["train/loss"] for row in history]
    assert len(losses) == 12
    assert losses[-1] < losses[0] - 1.5  # starts near ln(vocab) = 6.2


def test_gradient_accumulation_gives_the_full_batch_update(tmp_path, tiny_model_dir, sums_file):
    reference, _ = _train(_cfg(tmp_path, tiny_model_dir, sums_file, "data.micro_batch_size_per_gpu=4", run="m4"))
    expected = _weights(reference.model)
    for micro in (1, 2):
        split, _ = _train(_cfg(tmp_path, tiny_model_dir, sums_file, f"data.micro_batch_size_per_gpu={micro}",
                               run=f"m{micro}"))
        for name, param in split.model.named_parameters():
            torch.testing.assert_close(param, expected[name], rtol=0, atol=2e-6, msg=f"micro={micro} {name}")


@pytest.mark.parametrize("arch", ["llama", "gpt_oss", "olmo2", "olmo3", "deepseek_v3", "glm4_moe"])
def test_packing_gives_the_same_loss_and_update_as_padding(tmp_path, tiny_model_dir, sums_file, arch):
    """gpt_oss (issue 58): attention sinks and a window of 8, kept by the packed rows (the guard lets them run);
    OLMo 2 / 3: post-norms, whole-projection q / k norms, OLMo 3's window of 8."""
    if arch in ("deepseek_v3", "glm4_moe"):  # latent attention, grouped routing: not in the tiny table
        from tests.models.non_native import save_non_native

        tiny_model_dir = save_non_native(str(tmp_path / arch), arch)
    elif arch != "llama":
        from hybridflow.models.tiny import save_tiny_model

        tiny_model_dir = save_tiny_model(str(tmp_path / arch), arch=arch)
    padded, padded_history = _train(_cfg(tmp_path, tiny_model_dir, sums_file, f"data.val_files={sums_file}",
                                         run="pad"))
    packed, packed_history = _train(_cfg(tmp_path, tiny_model_dir, sums_file, f"data.val_files={sums_file}",
                                         "data.use_packing=True", run="pack"))
    assert packed.packed and not padded.packed
    for key in ("train/loss", "val/loss", "train/grad_norm"):
        assert packed_history[0][key] == pytest.approx(padded_history[0][key], rel=1e-5), key
    expected = _weights(padded.model)
    # Adam's first step is ~lr * g / (|g| + eps): where |g| is near eps (rarely seen embedding
    # rows) it magnifies fp32 summation-order noise (2.2e-6 measured on an AVX-512 machine).
    # A packing bug (attention across packed sequences) moves weights by ~lr = 1e-3.
    for name, param in packed.model.named_parameters():
        torch.testing.assert_close(param, expected[name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", [[], ["data.use_packing=True"]], ids=["padded", "packed"])
def test_sft_learns_on_cuda(tmp_path, tiny_model_dir, sums_file, layout):
    """The SFT trainer on ``cuda:0`` (``make test-gpu``): it trains, validates and checkpoints there."""
    cfg = _cfg(tmp_path, tiny_model_dir, sums_file, "trainer.device=cuda", "trainer.total_training_steps=12",
               "optim.lr=3e-3", f"data.val_files={sums_file}", "trainer.save_freq=12", *layout)
    trainer, history = _train(cfg)
    assert next(trainer.model.parameters()).is_cuda
    assert history[-1]["train/loss"] < history[0]["train/loss"] - 1.5


def test_verl_use_remove_padding_selects_the_packed_layout(tmp_path, tiny_model_dir, sums_file, monkeypatch):
    import hybridflow.trainer.sft_trainer as sft_trainer

    layouts = []
    real = sft_trainer.micro_batch_inputs
    monkeypatch.setattr(sft_trainer, "micro_batch_inputs",
                        lambda micro, **kw: layouts.append(kw["use_packing"]) or real(micro, **kw))
    _train(_cfg(tmp_path, tiny_model_dir, sums_file, "use_remove_padding=True"))
    assert layouts and all(layouts)


def test_validation_loss_is_the_token_mean_over_the_whole_val_set(tmp_path, tiny_model_dir, sums_file):
    # val set = the train set and a batch = the whole set: val/loss after the update and a
    # zero-lr train step on the updated weights measure the same token mean
    cfg = _cfg(tmp_path, tiny_model_dir, sums_file, f"data.val_files={sums_file}", "data.train_batch_size=8",
               "data.micro_batch_size_per_gpu=4", "trainer.total_training_steps=2", "trainer.test_freq=1")
    trainer, history = _train(cfg)
    assert [("val/loss" in row) for row in history] == [True, True]
    for group in trainer.state.optimizer.param_groups:
        group["lr"] = 0.0
    again = trainer.train_step(list(trainer.loader.dataset.samples))
    assert history[-1]["val/loss"] == pytest.approx(again["train/loss"], rel=1e-5)


def test_bf16_mixed_precision_step_is_close_to_fp32(tmp_path, tiny_model_dir, sums_file):
    # correctness only (bf16 matmuls are slow on CPU): fp32 weights, bf16 compute, one step
    _, fp32 = _train(_cfg(tmp_path, tiny_model_dir, sums_file, run="fp32"))
    trainer, bf16 = _train(_cfg(tmp_path, tiny_model_dir, sums_file, "model.fsdp_config.mixed_precision=bf16",
                                run="bf16"))
    assert all(param.dtype == torch.float32 for param in trainer.model.parameters())
    assert bf16[0]["train/loss"] == pytest.approx(fp32[0]["train/loss"], rel=2e-2)


# ---------------------------------------------------------------- checkpoints and export
def test_resume_gives_bitwise_identical_weights(tmp_path, tiny_model_dir, sums_file, capsys):
    # 8 samples, batch 2 -> 4 steps per epoch; 6 steps cross an epoch; resume mid-epoch at step 3
    args = ("data.train_batch_size=2", "data.micro_batch_size_per_gpu=1", "trainer.total_training_steps=6",
            "trainer.save_freq=3", "optim.lr_scheduler=cosine", "optim.warmup_steps_ratio=0.34")
    straight, history = _train(_cfg(tmp_path, tiny_model_dir, sums_file, *args, run="straight"))
    root = tmp_path / "straight"
    assert (root / TRACKER_FILE).read_text() == "6"
    assert (root / "global_step_3" / "model" / "dcp" / ".metadata").is_file()
    shutil.rmtree(root / "global_step_6")  # as if the run had crashed after step 3
    (root / TRACKER_FILE).write_text("3")
    capsys.readouterr()
    resumed, resumed_history = _train(_cfg(tmp_path, tiny_model_dir, sums_file, *args, run="straight"))
    assert f"hybridflow: resumed from {root / 'global_step_3'} at step 3" in capsys.readouterr().out  # issue 37
    assert [row["step"] for row in resumed_history] == [4, 5, 6]
    assert [row["train/loss"] for row in resumed_history] == [row["train/loss"] for row in history[3:]]
    expected = _weights(straight.model)
    for name, param in resumed.model.named_parameters():
        assert torch.equal(param, expected[name]), name


def test_huggingface_export_loads_with_identical_logits(tmp_path, tiny_model_dir, sums_file):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer, _ = _train(_cfg(tmp_path, tiny_model_dir, sums_file, "trainer.total_training_steps=2"))
    hf_dir = tmp_path / "run" / "global_step_2" / "model" / "huggingface"
    exported = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    assert AutoTokenizer.from_pretrained(hf_dir).chat_template
    ids = torch.tensor([trainer.tokenizer.encode("what is 3 + 4? 3 + 4 = 7")])
    trainer.model.eval()
    with torch.no_grad():
        assert torch.equal(exported(input_ids=ids).logits, trainer.model(input_ids=ids).logits)


def test_lora_trains_only_the_adapter_and_exports_the_merged_model(tmp_path, tiny_model_dir, sums_file):
    from transformers import AutoModelForCausalLM

    from hybridflow.models import load_causal_lm

    cfg = _cfg(tmp_path, tiny_model_dir, sums_file, "model.lora_rank=4", "model.lora_alpha=8",
               "trainer.total_training_steps=3")
    trainer, _ = _train(cfg)
    base = dict(load_causal_lm(tiny_model_dir).named_parameters())
    for name, param in trainer.model.named_parameters():
        if "lora_" in name:
            continue
        plain_name = name.replace("base_model.model.", "").replace(".base_layer", "")
        assert torch.equal(param, base[plain_name]), name
    assert any("lora_B" in n and param.abs().sum() > 0 for n, param in trainer.model.named_parameters())
    step_dir = tmp_path / "run" / "global_step_3" / "model"
    assert (step_dir / "lora_adapter" / "adapter_model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(step_dir / "huggingface", dtype=torch.float32)
    ids = torch.tensor([trainer.tokenizer.encode("what is 5 + 6? 5 + 6 = 11")])
    trainer.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, trainer.model(input_ids=ids).logits,
                                   rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- entry point
def test_main_writes_metrics_plots_summary_and_checkpoint(tmp_path, tiny_model_dir, sums_file, capsys):
    run = tmp_path / "cli"
    rc = main([f"model.partial_pretrain={tiny_model_dir}", f"data.train_files={sums_file}",
               f"data.val_files={sums_file}", "data.train_batch_size=4", "data.micro_batch_size_per_gpu=2",
               "trainer.total_epochs=1", f"trainer.default_local_dir={run}", "trainer.logger=[file]"])
    assert rc == 0
    lines = [json.loads(line) for line in (run / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert {"train/loss", "train/lr", "train/grad_norm", "val/loss", "perf/tokens_per_s"} <= set(lines[-1])
    assert "val/loss" in lines[-1] and "val/loss" not in lines[0]  # epoch end only (test_freq=-1)
    assert (run / "plots" / "loss.png").is_file()
    assert "train/loss" in capsys.readouterr().out
    assert (run / "global_step_2" / "model" / "huggingface" / "model.safetensors").is_file()


def test_bad_batch_arithmetic_is_a_one_line_error(tmp_path, tiny_model_dir, sums_file, capsys):
    rc = main([f"model.partial_pretrain={tiny_model_dir}", f"data.train_files={sums_file}",
               "data.train_batch_size=3", "data.micro_batch_size_per_gpu=2", f"trainer.default_local_dir={tmp_path}"])
    assert rc == 2
    assert "data.train_batch_size=3 is not divisible" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="custom_cls"):
        build_trainer(_cfg(tmp_path, tiny_model_dir, sums_file, "data.custom_cls.path=x.py"))


# ---------------------------------------------------------------- data parallel (2 processes)
def _torchrun(nproc, run_dir, model_dir, data_file):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               "-m", "hybridflow.trainer.sft_trainer", f"model.partial_pretrain={model_dir}",
               f"data.train_files={data_file}", "data.train_batch_size=4", "data.micro_batch_size_per_gpu=1",
               "trainer.total_training_steps=2", "optim.lr=1e-3", f"trainer.default_local_dir={run_dir}",
               "trainer.logger=[file]"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_two_data_parallel_ranks_match_one(tmp_path, tiny_model_dir, sums_file):
    from safetensors.torch import load_file

    _torchrun(1, tmp_path / "dp1", tiny_model_dir, sums_file)
    _torchrun(2, tmp_path / "dp2", tiny_model_dir, sums_file)
    weights = [load_file(tmp_path / run / "global_step_2" / "model" / "huggingface" / "model.safetensors")
               for run in ("dp1", "dp2")]
    assert weights[0].keys() == weights[1].keys()
    for name in weights[0]:
        torch.testing.assert_close(weights[1][name], weights[0][name], rtol=0, atol=2e-6, msg=name)
    losses = [[json.loads(line)["train/loss"] for line in (tmp_path / run / "logs" / "metrics.jsonl").open()]
              for run in ("dp1", "dp2")]
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)


def test_verl_global_micro_batch_size_sets_the_micro_batches(tmp_path, tiny_model_dir, sums_file, monkeypatch):
    """``data.micro_batch_size`` (verl's deprecated global key) wins over micro_batch_size_per_gpu."""
    import hybridflow.trainer.sft_trainer as sft_trainer

    sizes = []
    real_split = sft_trainer.split_micro
    monkeypatch.setattr(sft_trainer, "split_micro",
                        lambda samples, *, micro_batch_size: sizes.append(micro_batch_size) or real_split(
                            samples, micro_batch_size=micro_batch_size))
    trainer, _ = _train(_cfg(tmp_path, tiny_model_dir, sums_file, "data.micro_batch_size=1"))
    assert trainer.micro_batch_size == 1 and sizes == [1]


def test_a_tokenizer_larger_than_the_model_s_vocab_is_one_line_before_loading(tmp_path, tiny_model_dir, sums_file,
                                                                             tiny_tokenizer, monkeypatch):
    """Issue 50: ids past the embedding were an index error in the first forward."""
    import copy

    import hybridflow.trainer.sft_trainer as sft_trainer
    from hybridflow.errors import ModelError

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    larger = copy.deepcopy(tiny_tokenizer)
    larger.add_tokens(["<extra_0>", "<extra_1>"])
    larger.save_pretrained(folder)
    monkeypatch.setattr(sft_trainer, "load_causal_lm", lambda *a, **k: pytest.fail("loaded before checking"))
    with pytest.raises(ModelError, match=r"vocab_size=512 embedding rows but the tokenizer \(the model's own\) has "
                                         r"514 tokens: ids 512..513 would index past the embedding"):
        build_trainer(_cfg(tmp_path, str(folder), sums_file))


# ---------------------------------------------------------------- resume ownership (issue 61)
def _folder_state(root) -> dict[str, int]:
    """Every file under ``root`` with its modification time: what "nothing touched" compares."""
    return {os.path.join(d, n): os.stat(os.path.join(d, n)).st_mtime_ns for d, _, names in os.walk(root) for n in names}


@pytest.fixture
def full_model_run(tmp_path, tiny_model_dir, sums_file):
    """A finished 1-step full-model SFT run in ``tmp_path / "run"``."""
    _train(_cfg(tmp_path, tiny_model_dir, sums_file))
    return tmp_path / "run"


@pytest.mark.parametrize("override, named", [
    ("model.lora_rank=4", "it was made with model.lora_rank=0, this run has model.lora_rank=4"),
    ("model.partial_pretrain=OTHER", "it was made with model.partial_pretrain="),
    ("trainer.resume_mode=disable", "trainer.resume_mode=disable, but"),
])  # fmt: skip
def test_another_configurations_checkpoints_are_refused_and_left_untouched(tmp_path, tiny_model_dir, sums_file,
                                                                          full_model_run, override, named):
    if "OTHER" in override:
        from hybridflow.models.tiny import save_tiny_model

        save_tiny_model(str(tmp_path / "other"), arch="llama", seed=1)
        override = override.replace("OTHER", str(tmp_path / "other"))
    before = _folder_state(full_model_run)
    with pytest.raises(ConfigError) as refused:
        _train(_cfg(tmp_path, tiny_model_dir, sums_file, override, "trainer.total_training_steps=2"))
    message = str(refused.value)
    assert named in message and "\n" not in message and "trainer.start_over=true" in message
    assert _folder_state(full_model_run) == before


def test_start_over_deletes_the_old_run_and_trains_fresh(tmp_path, tiny_model_dir, sums_file, full_model_run):
    old_marker = _folder_state(full_model_run / "global_step_1")
    _, history = _train(_cfg(tmp_path, tiny_model_dir, sums_file, "model.lora_rank=4", "trainer.start_over=true"))
    assert [row["step"] for row in history] == [1]  # fresh, not resumed
    assert (full_model_run / "global_step_1" / "model" / "lora_adapter" / "adapter_model.safetensors").is_file()
    assert _folder_state(full_model_run / "global_step_1").keys() != old_marker.keys()
    _, resumed = _train(_cfg(tmp_path, tiny_model_dir, sums_file, "model.lora_rank=4",
                             "trainer.total_training_steps=2"))  # its own checkpoints: resumed at step 1
    assert [row["step"] for row in resumed] == [2]
