"""Checkpoint manager: round trip, crash safety, rotation, resume modes and the HF merger."""

import logging
import os
import random

import numpy as np
import pytest
import torch

from hybridflow.errors import ConfigError, ModelError
from hybridflow.models.hf_folder import save_hf_folder
from hybridflow.models.tiny import build_tiny_model
from hybridflow.trainer.checkpoints import manager as checkpoint
from hybridflow.trainer.checkpoints.manager import (
    COMPLETE_MARKER,
    TRACKER_FILE,
    complete_steps,
    find_resume_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from hybridflow.model_merger import merge as merge_checkpoint
from hybridflow.models.sharded_checkpoint import FSDPModelComponent  # at world size 1: one process, no group


def trained_actor(seed: int = 0):
    """A tiny model after one AdamW step (so the optimizer has moments) with a stepped scheduler."""
    model, tokenizer = build_tiny_model(arch="llama", seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda step: 1.0 / (step + 1))
    ids = torch.arange(1, 9)[None]
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return model, optimizer, scheduler, tokenizer


class Counter:
    """A plain state-dict object, as a dataloader or KL controller would be."""

    def __init__(self, value: int = 0):
        self.value = value

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def draw_random_numbers():
    return random.random(), np.random.rand(), torch.rand(3)


def save_counter_steps(root, steps, max_to_keep=None):
    for step in steps:
        save_checkpoint(str(root), step, {"actor": Counter(step)}, extra={"step": step}, max_to_keep=max_to_keep)


def test_round_trip_restores_weights_optimizer_scheduler_rng_and_extra(tmp_path):
    model, optimizer, scheduler, tokenizer = trained_actor()
    expected_weights = {k: v.clone() for k, v in model.state_dict().items()}
    expected_optim = optimizer.state_dict()
    extra = {"dataloader": {"epoch": 1, "index": 3}}
    actor = FSDPModelComponent(model, optimizer, scheduler, tokenizer)
    path = save_checkpoint(str(tmp_path), 3, {"actor": actor}, extra=extra)
    expected_draws = draw_random_numbers()  # what the run would draw next

    fresh_model, fresh_optimizer, fresh_scheduler, _ = trained_actor(seed=1)
    draw_random_numbers()  # move every generator on
    step, loaded_extra = load_checkpoint(path, {"actor": FSDPModelComponent(fresh_model, fresh_optimizer, fresh_scheduler)})

    assert step == 3 and loaded_extra == extra
    for key, value in fresh_model.state_dict().items():
        torch.testing.assert_close(value, expected_weights[key], rtol=0, atol=0)
    loaded_optim = fresh_optimizer.state_dict()
    for index, state in expected_optim["state"].items():
        torch.testing.assert_close(loaded_optim["state"][index]["exp_avg"], state["exp_avg"], rtol=0, atol=0)
        torch.testing.assert_close(loaded_optim["state"][index]["exp_avg_sq"], state["exp_avg_sq"], rtol=0, atol=0)
    assert fresh_scheduler.last_epoch == scheduler.last_epoch == 1
    assert fresh_optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 / 2)
    python_draw, numpy_draw, torch_draw = draw_random_numbers()
    assert (python_draw, numpy_draw) == expected_draws[:2]
    assert torch.equal(torch_draw, expected_draws[2])


def test_layout_matches_verl(tmp_path):
    model, optimizer, scheduler, tokenizer = trained_actor()
    components = {"actor": FSDPModelComponent(model, optimizer, scheduler, tokenizer), "critic": Counter(5)}
    path = save_checkpoint(str(tmp_path), 7, components, extra={"dataloader": {}})
    assert path == str(tmp_path / "global_step_7")
    actor_files = set(os.listdir(tmp_path / "global_step_7" / "actor"))
    assert {"dcp", "lr_scheduler.pt", "rng_state_rank0.pt", "huggingface"} <= actor_files
    hf_files = set(os.listdir(tmp_path / "global_step_7" / "actor" / "huggingface"))
    assert {"config.json", "generation_config.json", "tokenizer.json"} <= hf_files
    assert any(name.endswith(".distcp") for name in os.listdir(tmp_path / "global_step_7" / "actor" / "dcp"))
    assert sorted(os.listdir(tmp_path / "global_step_7")) == ["actor", COMPLETE_MARKER, "critic", "data.pt"]
    assert (tmp_path / TRACKER_FILE).read_text() == "7"
    assert sorted(os.listdir(tmp_path)) == ["global_step_7", TRACKER_FILE]  # no temp files left behind


def test_tracker_is_written_after_the_step_is_complete(tmp_path, monkeypatch):
    seen = []
    real_write_tracker = checkpoint._write_tracker

    def spy(root, step):
        seen.append(checkpoint.is_complete(checkpoint.step_dir(root, step)))
        real_write_tracker(root, step)

    monkeypatch.setattr(checkpoint, "_write_tracker", spy)
    save_counter_steps(tmp_path, [1])
    assert seen == [True]


def test_crash_before_tracker_resumes_previous_step(tmp_path, monkeypatch):
    save_counter_steps(tmp_path, [1])

    def crash(root, step):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(checkpoint, "_write_tracker", crash)
    with pytest.raises(KeyboardInterrupt):
        save_counter_steps(tmp_path, [2])
    assert find_resume_checkpoint(str(tmp_path), "auto") == str(tmp_path / "global_step_1")
    counter = Counter()
    step, extra = load_checkpoint(find_resume_checkpoint(str(tmp_path), "auto"), {"actor": counter})
    assert (step, extra, counter.value) == (1, {"step": 1}, 1)


def test_crash_while_writing_leaves_no_valid_looking_step(tmp_path, monkeypatch):
    save_counter_steps(tmp_path, [1])

    class Exploding(Counter):
        def state_dict(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(str(tmp_path), 2, {"actor": Counter(2), "critic": Exploding()})
    assert sorted(complete_steps(str(tmp_path))) == [1]
    assert not (tmp_path / "global_step_2").exists()
    assert find_resume_checkpoint(str(tmp_path), "auto") == str(tmp_path / "global_step_1")


def test_torn_and_temp_dirs_are_ignored_with_a_warning(tmp_path, caplog):
    save_counter_steps(tmp_path, [1])
    (tmp_path / "global_step_4" / "actor").mkdir(parents=True)  # torn: no completion marker
    (tmp_path / "global_step_5.tmp-12345" / "actor").mkdir(parents=True)  # never renamed
    (tmp_path / TRACKER_FILE).write_text("4")
    with caplog.at_level(logging.WARNING, logger="hybridflow.trainer.checkpoints.manager"):
        assert find_resume_checkpoint(str(tmp_path), "auto") == str(tmp_path / "global_step_1")
    assert "names global_step_4, which is missing or incomplete" in caplog.text
    os.remove(tmp_path / TRACKER_FILE)
    assert find_resume_checkpoint(str(tmp_path), "auto") == str(tmp_path / "global_step_1")


def test_leftover_temp_dir_of_a_dead_writer_is_removed_on_next_save(tmp_path):
    dead_pid = 2**22 + 7  # above Linux's pid_max, so no such process
    leftover = tmp_path / f"global_step_3.tmp-{dead_pid}"
    leftover.mkdir(parents=True)
    save_counter_steps(tmp_path, [4])
    assert not leftover.exists()


def test_rotation_keeps_newest_and_never_the_one_just_written(tmp_path):
    save_counter_steps(tmp_path, [1, 2, 3, 4, 5], max_to_keep=2)
    assert sorted(complete_steps(str(tmp_path))) == [4, 5]
    save_counter_steps(tmp_path, [2], max_to_keep=2)  # resaving an older step keeps it
    assert sorted(complete_steps(str(tmp_path))) == [2, 5]
    assert (tmp_path / TRACKER_FILE).read_text() == "2"
    save_counter_steps(tmp_path, [6, 7], max_to_keep=None)
    assert sorted(complete_steps(str(tmp_path))) == [2, 5, 6, 7]


def test_each_component_keeps_its_own_number_of_checkpoints(tmp_path):
    """max_actor_ckpt_to_keep=3, max_critic_ckpt_to_keep=1: critic/ goes from all but the newest step,
    a step goes once neither component is kept, and the newest step is always whole."""
    limits = {"actor": 3, "critic": 1}
    for step in [1, 2, 3, 4]:
        save_checkpoint(str(tmp_path), step, {"actor": Counter(step), "critic": Counter(-step)}, max_to_keep=limits)
    assert sorted(complete_steps(str(tmp_path))) == [2, 3, 4]
    parts = {s: sorted(p.name for p in (tmp_path / f"global_step_{s}").iterdir() if p.is_dir()) for s in [2, 3, 4]}
    assert parts == {2: ["actor"], 3: ["actor"], 4: ["actor", "critic"]}
    critic = Counter()
    load_checkpoint(str(tmp_path / "global_step_4"), {"critic": critic})
    assert critic.value == -4
    save_checkpoint(str(tmp_path), 5, {"actor": Counter(5), "critic": Counter(-5)}, max_to_keep={"actor": 1, "critic": None})
    assert sorted(complete_steps(str(tmp_path))) == [2, 3, 4, 5]  # the critic keeps all: no step is removed whole
    assert not (tmp_path / "global_step_4" / "actor").exists() and (tmp_path / "global_step_4" / "critic").exists()


def test_resaving_a_step_replaces_it(tmp_path):
    save_counter_steps(tmp_path, [1])
    save_checkpoint(str(tmp_path), 1, {"actor": Counter(42)})
    counter = Counter()
    load_checkpoint(str(tmp_path / "global_step_1"), {"actor": counter})
    assert counter.value == 42
    assert sorted(os.listdir(tmp_path)) == ["global_step_1", TRACKER_FILE]


def test_resume_modes(tmp_path):
    root = str(tmp_path)
    assert find_resume_checkpoint(root, "auto") is None  # nothing saved yet: fresh start
    save_counter_steps(tmp_path, [1, 2])
    assert find_resume_checkpoint(root, "auto") == str(tmp_path / "global_step_2")
    assert find_resume_checkpoint(root, "disable") is None
    explicit = str(tmp_path / "global_step_1")
    assert find_resume_checkpoint(root, "resume_path", resume_from_path=explicit) == explicit
    with pytest.raises(ConfigError, match="needs trainer.resume_from_path to be an existing"):
        find_resume_checkpoint(root, "resume_path")
    with pytest.raises(ConfigError, match="got '.*global_step_9'"):
        find_resume_checkpoint(root, "resume_path", resume_from_path=str(tmp_path / "global_step_9"))
    with pytest.raises(ConfigError, match="must name a global_step_N directory"):
        find_resume_checkpoint(root, "resume_path", resume_from_path=str(tmp_path))
    with pytest.raises(ConfigError, match=r"not one of \['auto', 'disable', 'resume_path'\]"):
        find_resume_checkpoint(root, "latest")


def test_load_missing_component_is_a_clear_error(tmp_path):
    save_counter_steps(tmp_path, [1])
    with pytest.raises(ModelError, match="has no 'critic' component"):
        load_checkpoint(str(tmp_path / "global_step_1"), {"critic": Counter()})


def test_merge_checkpoint_gives_a_loadable_model_with_identical_logits(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, optimizer, scheduler, tokenizer = trained_actor()
    path = save_checkpoint(str(tmp_path / "ckpt"), 1, {"actor": FSDPModelComponent(model, optimizer, scheduler, tokenizer)})
    target = merge_checkpoint(os.path.join(path, "actor"), str(tmp_path / "merged"))
    merged = AutoModelForCausalLM.from_pretrained(target)
    ids = torch.tensor([[5, 17, 42, 99, 3]])
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=0)
    merged_tokenizer = AutoTokenizer.from_pretrained(target)
    assert merged_tokenizer("3 + 4 = 7")["input_ids"] == tokenizer("3 + 4 = 7")["input_ids"]
    assert merged.generation_config.eos_token_id == tokenizer.eos_token_id
    with pytest.raises(ModelError, match="is not a checkpoint directory"):
        merge_checkpoint(path, str(tmp_path / "wrong"))


def test_save_hf_folder_with_weights_loads(tmp_path):
    from transformers import AutoModelForCausalLM

    model, tokenizer = build_tiny_model(arch="qwen2", seed=3)
    save_hf_folder(model, tokenizer, str(tmp_path / "hf"))
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    for key, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, rtol=0, atol=0)


def test_merge_keeps_bf16_weights_bit_exact(tmp_path, tiny_tokenizer):
    from safetensors.torch import load_file

    model, tokenizer = build_tiny_model(arch="qwen2", seed=2, tokenizer=tiny_tokenizer)
    model.to(torch.bfloat16)
    path = save_checkpoint(str(tmp_path / "ckpt"), 4, {"actor": FSDPModelComponent(model, tokenizer=tokenizer)})
    target = merge_checkpoint(os.path.join(path, "actor"), str(tmp_path / "merged"))
    merged = load_file(os.path.join(target, "model.safetensors"))
    original = model.state_dict()
    assert merged and all(tensor.dtype == torch.bfloat16 for tensor in merged.values())
    for key, tensor in merged.items():
        assert torch.equal(tensor, original[key]), key


def test_save_and_load_contents_choose_what_a_component_holds(tmp_path):
    """checkpoint.save_contents / load_contents on the FSDP2 component the PPO workers use."""
    from transformers import AutoModelForCausalLM

    model, optimizer, scheduler, tokenizer = trained_actor()
    lean = FSDPModelComponent(model, optimizer, scheduler, tokenizer, save_contents=["model", "hf_model"])
    path = save_checkpoint(str(tmp_path), 1, {"actor": lean})
    actor_dir = os.path.join(path, "actor")
    assert not os.path.exists(os.path.join(actor_dir, "lr_scheduler.pt"))  # no "extra"
    exported = AutoModelForCausalLM.from_pretrained(os.path.join(actor_dir, "huggingface"))
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(exported.state_dict()[name], tensor)

    fresh, fresh_optimizer, fresh_scheduler, _ = trained_actor(seed=1)
    moments = {k: v.clone() for k, v in fresh_optimizer.state_dict()["state"][0].items()}
    # asks for the optimizer too, but the checkpoint has none: the weights load, the optimizer is left alone
    load_checkpoint(path, {"actor": FSDPModelComponent(fresh, fresh_optimizer, fresh_scheduler)})
    torch.testing.assert_close(fresh.state_dict(), model.state_dict())
    torch.testing.assert_close(fresh_optimizer.state_dict()["state"][0], moments)

    full = save_checkpoint(str(tmp_path), 2, {"actor": FSDPModelComponent(model, optimizer, scheduler, tokenizer)})
    assert not os.path.exists(os.path.join(full, "actor", "huggingface", "model.safetensors"))  # no hf_model
    other, other_optimizer, other_scheduler, _ = trained_actor(seed=2)
    load_checkpoint(full, {"actor": FSDPModelComponent(other, other_optimizer, other_scheduler,
                                                       load_contents=["model", "optimizer", "extra"])})
    torch.testing.assert_close(other_optimizer.state_dict()["state"][0], optimizer.state_dict()["state"][0])
    weights_only, weights_only_optimizer, _, _ = trained_actor(seed=3)
    before = {k: v.clone() for k, v in weights_only_optimizer.state_dict()["state"][0].items()}
    load_checkpoint(full, {"actor": FSDPModelComponent(weights_only, weights_only_optimizer, load_contents=["model"])})
    torch.testing.assert_close(weights_only.state_dict(), model.state_dict())
    torch.testing.assert_close(weights_only_optimizer.state_dict()["state"][0], before)
