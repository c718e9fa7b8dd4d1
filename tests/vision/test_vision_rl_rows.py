"""Every log-prob forward of a GRPO step on images (old log-probs, reference, the update) gives each row the
images its response was sampled from, after every reorder: the ``rollout.n`` repeat, the actor's mini-batch
shuffle over two PPO epochs, token-budget micro-batches, and the balance over data-parallel shards.

All prompts of the shape-count task have the same text and the same number of image tokens, so a row that
got another row's images would pass every shape check and only make the gradient noise; the test follows
each row by its sampled tokens and their rollout log-probs instead, up to the rows the model's vision inputs are
built from. (Inside HF generate, its own repeat of the images for ``n`` samples shows in the agreement of
rollout and training log-probs, ``rollout_corr/kl``.)"""

from __future__ import annotations

import hashlib

import pytest
import torch

from hybridflow.data.batch import Batch
from hybridflow.data.balance import balance_batch
from hybridflow.data.preprocess import shape_count


def image_digest(vision: dict) -> str:
    return hashlib.sha1(torch.as_tensor(vision["pixel_values"]).float().numpy().tobytes()).hexdigest()


def sampled_row_key(tokens, log_probs) -> tuple:
    """A sampled response told apart by its tokens and their rollout log-probs (which depend on the image)."""
    return tuple(int(t) for t in tokens), tuple(round(float(lp), 5) for lp in log_probs)


class ImageSpy:
    """Records the images each sampled response was generated from, then the images each forward gives it."""

    def __init__(self):
        self.sampled_from: dict[tuple, set[str]] = {}
        self.expected: list[set[str]] = []  # per row of the running micro-batch
        self.forwards: list[tuple[bool, bool]] = []  # (with gradients, the row's images are its rollout's)

    def wrap_generate(self, generate):
        def spy(engine, prompt_token_ids, params, *, multi_modal_inputs=None):
            completions = generate(engine, prompt_token_ids, params, multi_modal_inputs=multi_modal_inputs)
            for completion in completions:
                key = sampled_row_key(completion.token_ids, completion.logprobs)
                self.sampled_from.setdefault(key, set()).add(image_digest(multi_modal_inputs[completion.prompt_index]))
            return completions
        return spy

    def wrap_forward(self, forward):
        """Notes which images each row of a log-prob micro-batch was sampled from."""
        def spy(model, micro, **kwargs):
            lengths = micro["response_mask"].sum(-1).tolist()
            self.expected = [self.sampled_from.get(sampled_row_key(micro["responses"][row, :length],
                                                                   micro["rollout_log_probs"][row, :length]), set())
                             for row, length in enumerate(lengths)]
            return forward(model, micro, **kwargs)
        return spy

    def wrap_vision_inputs(self, vision_forward_inputs):
        """Checks the images the forward's model inputs are built from, row by row, against those."""
        def spy(model, rows, input_ids):
            for row, vision in enumerate(rows):
                self.forwards.append((torch.is_grad_enabled(), image_digest(vision) in self.expected[row]))
            return vision_forward_inputs(model, rows, input_ids)
        return spy


@pytest.fixture(scope="module")
def shape_rows(tmp_path_factory):
    return shape_count.main(["--size", "8", "--test_size", "2", "--local_save_dir",
                             str(tmp_path_factory.mktemp("shapes"))])


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
def test_every_forward_of_a_grpo_step_sees_the_images_its_rows_were_sampled_from(tmp_path, tiny_vl_dir, shape_rows,
                                                                                  monkeypatch, arch):
    import hybridflow.workers.actor as actor_module
    import hybridflow.workers.logprob as logprob_module
    from hybridflow.models.tiny import save_tiny_vl_model
    from hybridflow.rollout.hf import HFEngine
    from hybridflow.rollout.native import NativeEngine
    from hybridflow.trainer.main_ppo import main

    if arch != "qwen2_5_vl":
        tiny_vl_dir = save_tiny_vl_model(str(tmp_path / arch), arch=arch)

    spy = ImageSpy()
    for engine_class in (HFEngine, NativeEngine):  # the native engine decodes VLMs; HF is the fallback
        monkeypatch.setattr(engine_class, "generate", spy.wrap_generate(engine_class.generate))
    forward = spy.wrap_forward(logprob_module.micro_batch_log_probs)
    monkeypatch.setattr(logprob_module, "micro_batch_log_probs", forward)
    monkeypatch.setattr(actor_module, "micro_batch_log_probs", forward)
    vision_inputs = spy.wrap_vision_inputs(logprob_module.vision_forward_inputs)
    monkeypatch.setattr(logprob_module, "vision_forward_inputs", vision_inputs)
    assert main([
        f"actor_rollout_ref.model.path={tiny_vl_dir}", f"data.train_files={shape_rows['train']}",
        f"data.val_files={shape_rows['test']}", "data.train_batch_size=4", "data.max_prompt_length=64",
        "data.max_response_length=6", "actor_rollout_ref.rollout.n=3", "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.shuffle=True",
        "actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=200", "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=5",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=7",
        "trainer.total_training_steps=2", "trainer.save_freq=-1", "trainer.test_freq=-1",
        "trainer.val_before_train=False", "trainer.logger=[console]", f"trainer.default_local_dir={tmp_path}",
    ]) == 0
    with_grad = [same for grad, same in spy.forwards if grad]
    without_grad = [same for grad, same in spy.forwards if not grad]
    # per step: 12 rows x (old log-probs + reference) without gradients, 12 rows x 2 PPO epochs with them
    assert len(without_grad) == 2 * 2 * 12 and len(with_grad) == 2 * 2 * 12
    assert all(with_grad) and all(without_grad)


def test_balancing_over_shards_moves_each_rows_images_with_it():
    lengths = [9, 2, 7, 7, 1, 5, 3, 8]
    mask = torch.tensor([[1] * n + [0] * (10 - n) for n in lengths])
    images = [{"pixel_values": torch.full((n, 4), float(row))} for row, n in enumerate(lengths)]
    batch = Batch.from_dict(tensors={"attention_mask": mask, "row": torch.arange(8)},
                            non_tensors={"multi_modal_inputs": images})
    balance_batch(batch, dp_size=2)
    assert batch["row"].tolist() != list(range(8))  # the rows did move
    assert [int(vision["pixel_values"][0, 0]) for vision in batch["multi_modal_inputs"]] == batch["row"].tolist()
