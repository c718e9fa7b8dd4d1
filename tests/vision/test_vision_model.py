"""Tiny Qwen2.5-VL, Qwen2-VL and Qwen3-VL models through hybridflow's forward, rollout and freeze: equal to HF's own
forward and generate."""

from __future__ import annotations

import warnings

import pytest
import torch

from hybridflow.data.batch import Batch
from hybridflow.data.padding import pad_sequences
from hybridflow.errors import DataError
from hybridflow.models.vision import freeze_vision_tower, vision_forward_inputs, vision_tower
from hybridflow.rollout import SamplingParams
from hybridflow.rollout.engine import build_engine
from hybridflow.rollout.hf import HFEngine
from hybridflow.workers.logprob import batch_log_probs, micro_batch_log_probs
from tests.vision.conftest import solid_image

PROMPTS = [  # (text, image size): the rows have 4, 12 and 9 image tokens
    ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>How many?<|im_end|>\n<|im_start|>assistant\n",
     (56, 56)),
    ("<|im_start|>user\nCount <|vision_start|><|image_pad|><|vision_end|> the shapes<|im_end|>\n"
     "<|im_start|>assistant\n", (112, 84)),
    ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>?<|im_end|>\n<|im_start|>assistant\n", (84, 84)),
]
RESPONSES = [[65, 66, 67, 68, 69], [70, 71], [72, 73, 74]]
MIXED = [PROMPTS[0], ("<|im_start|>user\nHow many shapes?<|im_end|>\n<|im_start|>assistant\n", None), PROMPTS[2]]
"""Rows with 4, 0 and 9 image tokens: a text prompt between two with images."""


def processed(processor, text, size, colour="red"):
    images = None if size is None else [solid_image(*size, colour)]
    return processor(text=[text], images=images, return_tensors="pt")


def rollout_batch(processor, colours=("red", "blue", "green"), prompts=PROMPTS) -> tuple[Batch, list]:
    """Left-padded prompts ++ right-padded responses, with each row's images, as the rollout worker builds it."""
    outs = [processed(processor, text, size, colour) for (text, size), colour in zip(prompts, colours)]
    pad = processor.tokenizer.pad_token_id
    prompts = pad_sequences([o["input_ids"][0].tolist() for o in outs], pad_value=pad, side="left")
    responses = pad_sequences(RESPONSES, pad_value=pad, side="right")
    prompt_mask = (prompts != pad).long()
    response_mask = pad_sequences([[1] * len(r) for r in RESPONSES], pad_value=0, side="right")
    attention_mask = torch.cat([prompt_mask, response_mask], 1)
    batch = Batch({"input_ids": torch.cat([prompts, responses], 1), "attention_mask": attention_mask,
                   "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0), "responses": responses,
                   "response_mask": response_mask},
                  {"multi_modal_inputs": [{"pixel_values": o["pixel_values"], "image_grid_thw": o["image_grid_thw"]}
                                          if "pixel_values" in o else None for o in outs]})
    return batch, outs


def hf_log_probs(model, out, response: list[int]) -> torch.Tensor:
    """HF's own forward on one unpadded row: the processor's outputs (with or without images) with the response
    appended."""
    ids = torch.cat([out["input_ids"], torch.tensor([response])], 1)
    types = torch.cat([out["mm_token_type_ids"], torch.zeros(1, len(response), dtype=torch.long)], 1)
    images = {key: out[key] for key in ("pixel_values", "image_grid_thw") if key in out}
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=types, **images).logits
    log_probs = torch.log_softmax(logits[0, -len(response) - 1:-1].float(), -1)
    return log_probs.gather(-1, torch.tensor(response)[:, None])[:, 0]


@torch.no_grad()
@pytest.mark.parametrize("prompts", [PROMPTS, MIXED], ids=["images", "mixed"])
def test_log_probs_with_images_equal_hf_forward_row_by_row(vl_arch, prompts):
    model, processor = vl_arch
    batch, outs = rollout_batch(processor, prompts=prompts)
    log_probs, entropy = batch_log_probs(model, batch, temperature=1.0, micro_batch_size=2, calculate_entropy=True)
    assert log_probs.shape == entropy.shape == (3, 5)
    for row, (out, response) in enumerate(zip(outs, RESPONSES)):
        expected = hf_log_probs(model, out, response)
        torch.testing.assert_close(log_probs[row, :len(response)], expected, rtol=1e-5, atol=1e-5)


def test_the_images_change_the_log_probs(vl_arch):
    """Guards the parity test: the images (their pixels) reach the language model."""
    model, processor = vl_arch
    red, _ = rollout_batch(processor)
    other, _ = rollout_batch(processor, colours=("white", "black", "yellow"))
    assert not torch.allclose(batch_log_probs(model, red, temperature=1.0, micro_batch_size=3)[0],
                              batch_log_probs(model, other, temperature=1.0, micro_batch_size=3)[0], atol=1e-4)


def test_freeze_vision_tower_gives_it_no_gradients(vl_arch_dir):
    from hybridflow.models import load_causal_lm, load_tokenizer
    from hybridflow.models.vision import load_processor

    grads = {}
    for freeze in (False, True):
        model = load_causal_lm(vl_arch_dir)
        processor = load_processor(vl_arch_dir, tokenizer=load_tokenizer(vl_arch_dir))
        frozen = freeze_vision_tower(model) if freeze else 0
        batch, _ = rollout_batch(processor)
        log_probs, _ = micro_batch_log_probs(model, batch, temperature=1.0, calculate_entropy=False)
        (log_probs * batch["response_mask"]).sum().backward()
        tower = vision_tower(model)
        grads[freeze] = ([p.grad for p in tower.parameters()],
                         [p.grad for p in model.model.language_model.parameters()])
        assert frozen == (sum(p.numel() for p in tower.parameters()) if freeze else 0)
    tower_grads, lm_grads = grads[True]
    assert all(g is None for g in tower_grads) and all(g is not None and g.abs().sum() > 0 for g in lm_grads)
    tower_grads, _ = grads[False]
    assert all(g is not None for g in tower_grads) and sum(g.abs().sum() for g in tower_grads) > 0


@torch.no_grad()
def test_hf_engine_greedy_with_images_equals_hf_generate(vl_arch):
    model, processor = vl_arch
    engine = HFEngine(model, processor.tokenizer)
    outs = [processed(processor, text, size) for text, size in PROMPTS]
    images = [{"pixel_values": o["pixel_values"], "image_grid_thw": o["image_grid_thw"]} for o in outs]
    params = SamplingParams(n=1, temperature=0.0, max_tokens=6, ignore_eos=True)
    completions = engine.generate([o["input_ids"][0].tolist() for o in outs], params, multi_modal_inputs=images)
    for completion, out in zip(completions, outs):
        expected = model.generate(**out, max_new_tokens=6, do_sample=False, eos_token_id=None)
        assert completion.token_ids == expected[0, out["input_ids"].shape[1]:].tolist()
    sampled = engine.generate([o["input_ids"][0].tolist() for o in outs],
                              SamplingParams(n=2, temperature=1.0, max_tokens=4, seed=0), multi_modal_inputs=images)
    assert [c.prompt_index for c in sampled] == [0, 0, 1, 1, 2, 2]


def test_native_rollout_of_a_vlm_decodes_natively_and_other_backends_say_why(tiny_vl):
    """rollout.name=native decodes a vision-language model in the native engine (tests/vision/test_native_vl_engine.py);
    a backend that does not (vLLM / SGLang here) runs it through HF generate and says so."""
    from hybridflow.rollout import engine as engines
    from hybridflow.rollout.native import NativeEngine

    model, processor = tiny_vl
    assert isinstance(build_engine("native", model, processor.tokenizer), NativeEngine)
    engines.ENGINES["text-only-test"] = lambda *args, **kwargs: pytest.fail("a text-only backend got a VLM")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine = build_engine("text-only-test", model, processor.tokenizer)
    finally:
        del engines.ENGINES["text-only-test"]
    assert isinstance(engine, HFEngine)
    (message,) = [str(w.message) for w in caught if "vision-language" in str(w.message)]
    assert "rollout.name=text-only-test runs" in message and "rollout.name=native decodes it natively" in message


def test_a_text_batch_gets_no_vision_inputs(tiny_vl):
    model, _ = tiny_vl
    assert vision_forward_inputs(model, [None, {}], torch.zeros(2, 3, dtype=torch.long)) == {}


@torch.no_grad()
def test_image_tokens_without_their_images_are_refused(vl_arch):
    model, processor = vl_arch
    batch, _ = rollout_batch(processor)
    lost = Batch({key: batch[key] for key in batch.tensors}, {"multi_modal_inputs": [None, None, None]})
    with pytest.raises(DataError, match="the batch holds 25 image tokens but its images make 0"):
        micro_batch_log_probs(model, lost, temperature=1.0, calculate_entropy=False)
    with pytest.raises(DataError, match="holds 25 image tokens but its images make 0"):
        HFEngine(model, processor.tokenizer).generate([row[row != 0].tolist() for row in batch["input_ids"]],
                                                      SamplingParams(max_tokens=2))


@torch.no_grad()
def test_rollout_worker_sends_each_prompt_s_images(tmp_path, vl_arch):
    """The dataset's collated prompts through the rollout worker: greedy tokens equal HF generate row by row."""
    import pandas as pd

    from hybridflow.data.rl_dataset import RLDataset
    from hybridflow.data.vision import image_to_bytes
    from hybridflow.trainer.loop.generation import prompts_to_batch
    from hybridflow.workers.rollout import RolloutWorker

    model, processor = vl_arch
    rows = [{"prompt": [{"role": "user", "content": "<image>How many?"}], "images": [image_to_bytes(solid_image(*s))]}
            for s in ((56, 56), (112, 84))]
    pd.DataFrame(rows).to_parquet(tmp_path / "rows.parquet")
    dataset = RLDataset(str(tmp_path / "rows.parquet"), processor.tokenizer, processor=processor)
    prompts = prompts_to_batch(dataset.collate_fn([dataset[0], dataset[1]]))
    worker = RolloutWorker(engine=HFEngine(model, processor.tokenizer), pad_token_id=processor.tokenizer.pad_token_id)
    out = worker.generate(prompts, SamplingParams(n=1, temperature=0.0, max_tokens=5, ignore_eos=True))
    for row in range(2):
        ids = torch.tensor([dataset.prompt_ids[row]])
        vision = dataset.vision[row]
        expected = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=5,
                                  do_sample=False, eos_token_id=None, pixel_values=vision["pixel_values"],
                                  image_grid_thw=vision["image_grid_thw"],
                                  mm_token_type_ids=(ids == processor.image_token_id).long())
        assert out["responses"][row].tolist() == expected[0, ids.shape[1]:].tolist()


@torch.no_grad()
def test_rollouts_never_sample_the_vision_tokens(vl_arch_dir):
    """A model that prefers <|image_pad|> above all tokens still answers in text: a response holding an
    image token would be an image without pixels in the training forward."""
    from hybridflow.models import load_causal_lm, load_tokenizer

    model = load_causal_lm(vl_arch_dir)
    tokenizer = load_tokenizer(vl_arch_dir)
    vision_ids = [model.config.image_token_id, model.config.video_token_id, model.config.vision_start_token_id,
                  model.config.vision_end_token_id]
    model.lm_head.weight[vision_ids] = model.lm_head.weight[vision_ids] * 0 + 10 * model.lm_head.weight.abs().max()
    model.config.tie_word_embeddings = False
    engine = HFEngine(model, tokenizer)
    prompt = [tokenizer("what is 1 + 1?")["input_ids"]]
    greedy = engine.generate(prompt, SamplingParams(max_tokens=6, ignore_eos=True))
    sampled = engine.generate(prompt, SamplingParams(n=4, temperature=1.0, max_tokens=6, ignore_eos=True, seed=0))
    for completion in greedy + sampled:
        assert not set(completion.token_ids) & set(vision_ids), completion.token_ids


def test_sequence_parallelism_of_a_vlm_is_refused_in_one_line(tiny_vl):
    from hybridflow.errors import ConfigError
    from hybridflow.models.ulysses import SequenceParallel, split_sequences

    model, _ = tiny_vl
    key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    with pytest.raises(ConfigError, match=f"{key}=2: a vision-language model runs padded rows"):
        split_sequences(model, SequenceParallel(size=2, rank=0), key=key)
    assert split_sequences(model, SequenceParallel(size=1, rank=0), key=key) is model
