"""The native engine decodes Qwen2-VL / Qwen2.5-VL / Qwen3-VL (issue 51): greedy tokens equal HF ``generate``'s in
fp32 with 1, 0 and 2 images a row mixed in one batch, under preemption, chunked prefill and the prefix cache; two
prompts with the same text and different images never share blocks; the vision tokens are never sampled."""

from __future__ import annotations

import copy

import pytest
import torch

from hybridflow.errors import DataError
from hybridflow.rollout import SamplingParams
from hybridflow.rollout.block_manager import BLOCK_SIZE
from hybridflow.rollout.engine import build_engine
from hybridflow.rollout.hf import HFEngine
from hybridflow.rollout.native import NativeEngine
from hybridflow.rollout.request_queue import RequestQueue
from tests.vision.conftest import solid_image

ROWS = [  # (question, images as (width, height, colour)): 1, 0, 2 and 1 images; rows 0 and 3 differ only in pixels
    ("what colour is it?", [(64, 48, "red")]),
    ("hello there, how are you today?", []),
    ("compare these two", [(40, 80, "red"), (96, 64, "blue")]),
    ("what colour is it?", [(64, 48, "green")]),
]


def spread_weights(model, seed: int = 0, scale: float = 2.0):
    """Random weights far from HF's small init (whose tiny models answer every prompt with one token), so greedy
    answers differ by prompt and by image and a wrong position or embedding shows in the tokens."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if weight.dim() >= 2:
                weight.copy_(torch.randn(weight.shape, generator=generator) * scale / weight.shape[-1] ** 0.5)
            elif name.endswith("norm.weight"):
                weight.copy_(0.5 + torch.rand(weight.shape, generator=generator))
    return model


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen2_vl", "qwen3_vl"])
def spread_vl(request):
    from hybridflow.models.tiny import build_tiny_vl_model

    model, processor = build_tiny_vl_model(arch=request.param, seed=0)
    return spread_weights(model), processor


def prompt_rows(processor, rows=ROWS) -> tuple[list[list[int]], list[dict | None]]:
    """Each row's prompt ids (the chat template, images expanded to their tokens) and its images."""
    ids, images = [], []
    for question, pictures in rows:
        content = [{"type": "image"} for _ in pictures] + [{"type": "text", "text": question}]
        text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                             tokenize=False)
        out = processor(text=[text], images=[solid_image(w, h, c) for w, h, c in pictures] or None,
                        return_tensors="pt")
        ids.append(out["input_ids"][0].tolist())
        images.append({"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
                      if pictures else None)
    return ids, images


def greedy(max_tokens: int, tokenizer, n: int = 1) -> SamplingParams:
    return SamplingParams(n=n, temperature=0.0, max_tokens=max_tokens, logprobs=True,
                          stop_token_ids=[tokenizer.eos_token_id])


def assert_same_completions(native, reference, n: int = 1):
    for index, completion in enumerate(native):
        expected = reference[index // n]
        assert completion.token_ids == expected.token_ids, index
        torch.testing.assert_close(torch.tensor(completion.logprobs), torch.tensor(expected.logprobs),
                                   rtol=0, atol=1e-4)


@torch.no_grad()
def test_greedy_equals_hf_generate_with_one_none_and_two_images_a_row(spread_vl):
    model, processor = spread_vl
    ids, images = prompt_rows(processor)
    params = greedy(24, processor.tokenizer)
    reference = HFEngine(model, processor.tokenizer).generate(ids, params, multi_modal_inputs=images)
    engine = build_engine("native", model, processor.tokenizer)
    assert isinstance(engine, NativeEngine)
    completions = engine.generate(ids, params, multi_modal_inputs=images)
    assert_same_completions(completions, reference)
    assert completions[0].token_ids != completions[3].token_ids  # the same question, other pixels: the image counts


@torch.no_grad()
def test_greedy_under_preemption_with_shared_image_prefills(spread_vl):
    """Two samples a prompt (they share its prefill, images included) in a pool of blocks for one longest
    sequence and two more: sequences are preempted and recomputed from their images, prompts and tokens."""
    model, processor = spread_vl
    ids, images = prompt_rows(processor)
    params = greedy(30, processor.tokenizer, n=2)
    blocks = -(-(max(map(len, ids)) + 30) // BLOCK_SIZE) + 3
    engine = NativeEngine(model, processor.tokenizer, num_kv_blocks=blocks, decode_lanes=False)
    completions = engine.generate(ids, params, multi_modal_inputs=images)
    assert engine.preemptions > 0
    reference = HFEngine(model, processor.tokenizer).generate(ids, greedy(30, processor.tokenizer),
                                                              multi_modal_inputs=images)
    assert_same_completions(completions, reference, n=2)
    assert engine.allocator.available == engine.allocator.num_blocks - 1


@torch.no_grad()
def test_decode_lanes_slice_each_rows_rotation(spread_vl):
    """32 rows on 2 threads decode in two concurrent lanes of 16 (:mod:`hybridflow.rollout.lanes`): each lane takes
    its own rows' M-RoPE rotations."""
    model, processor = spread_vl
    ids, images = prompt_rows(processor)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        engine = NativeEngine(model, processor.tokenizer, max_num_seqs=32)
        completions = engine.generate(ids, greedy(10, processor.tokenizer, n=8), multi_modal_inputs=images)
    finally:
        torch.set_num_threads(threads)
    assert engine.lanes is not None
    reference = HFEngine(model, processor.tokenizer).generate(ids, greedy(10, processor.tokenizer),
                                                              multi_modal_inputs=images)
    assert_same_completions(completions, reference, n=8)


@torch.no_grad()
@pytest.mark.parametrize("threads", [1, 2])
def test_overlapped_steps_keep_each_rows_rotation(spread_vl, threads):
    """The engine's ``overlap_steps`` (a step launched before the previous one is read back, rows that ended decoded
    once more as padding) gives the synchronous steps' tokens and log-probs with M-RoPE rows: in one batch, and in
    concurrent decode lanes (2 threads, 32 rows)."""
    model, processor = spread_vl
    ids, images = prompt_rows(processor)
    params = SamplingParams(n=8, temperature=0.0, max_tokens=12, logprobs=True,
                            stop_token_ids=[processor.tokenizer.eos_token_id])
    default = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        outputs = []
        for overlap in (False, True):
            engine = NativeEngine(model, processor.tokenizer, max_num_seqs=32, overlap_steps=overlap)
            queue = RequestQueue(engine, keyed_draws=True)
            encoded = engine.encode_images(ids, images)
            requests = [queue.submit(p, params, images=i) for p, i in zip(ids, encoded)]
            queue.drain()
            queue.close()
            outputs.append([(c.token_ids, c.logprobs, c.finish_reason) for r in requests for c in r.future.result()])
    finally:
        torch.set_num_threads(default)
    assert outputs[0] == outputs[1] and queue.run.overlapped_readbacks > 0
    assert (engine.lanes is not None) == (threads == 2)


@torch.no_grad()
def test_chunked_prefill_splits_images_across_steps(spread_vl):
    """A budget of 12 tokens a step cuts the prompts (22 to 40 tokens) mid-image: each chunk takes its own image
    tokens' embeddings and positions."""
    model, processor = spread_vl
    ids, images = prompt_rows(processor)
    engine = NativeEngine(model, processor.tokenizer, max_num_seqs=4, max_num_batched_tokens=12,
                          enable_chunked_prefill=True)
    params = greedy(16, processor.tokenizer)
    completions = engine.generate(ids, params, multi_modal_inputs=images)
    reference = HFEngine(model, processor.tokenizer).generate(ids, params, multi_modal_inputs=images)
    assert_same_completions(completions, reference)


@torch.no_grad()
def test_prefix_cache_names_image_blocks_by_their_pixels(spread_vl):
    """A long question after the image fills whole blocks; the second call's prompts repeat the first's with the
    pixels changed, so a name by token ids alone would hand them the first call's keys and values."""
    model, processor = spread_vl
    long = "describe every part of this picture in great detail please " * 3
    first_ids, first_images = prompt_rows(processor, [(long, [(64, 48, "red")])])
    second_ids, second_images = prompt_rows(processor, [(long, [(64, 48, "green")]), (long, [(64, 48, "red")])])
    engine = NativeEngine(model, processor.tokenizer, prefix_cache_tokens=4096)
    params = greedy(12, processor.tokenizer)
    engine.generate(first_ids, params, multi_modal_inputs=first_images)
    assert engine.allocator.key_of  # the first prompt's blocks stay named
    completions = engine.generate(second_ids, params, multi_modal_inputs=second_images)
    reference = HFEngine(model, processor.tokenizer).generate(second_ids, params, multi_modal_inputs=second_images)
    assert_same_completions(completions, reference)
    assert completions[0].token_ids != completions[1].token_ids


@torch.no_grad()
def test_weights_loaded_into_an_owned_copy_decode_as_hf(spread_vl):
    """The trainer's rollout copy: the engine owns it (projections dropped once packed) and takes the actor's
    weights by their HF names (``model.language_model.layers.*``, ``model.visual.*``)."""
    model, processor = spread_vl
    ids, images = prompt_rows(processor)
    engine = NativeEngine(copy.deepcopy(model), processor.tokenizer, own_model=True)
    params = greedy(12, processor.tokenizer)
    engine.generate(ids, params, multi_modal_inputs=images)  # the old tower's outputs must not outlive its weights
    updated = spread_weights(copy.deepcopy(model), seed=5)
    engine.load_weights(list(updated.state_dict().items()))
    completions = engine.generate(ids, params, multi_modal_inputs=images)
    reference = HFEngine(updated, processor.tokenizer).generate(ids, params, multi_modal_inputs=images)
    assert_same_completions(completions, reference)


@torch.no_grad()
def test_the_vision_tokens_are_never_sampled(spread_vl):
    """A model that prefers the vision tokens above all others still answers in text (as the HF engine's
    ``suppress_tokens``): a response holding an image token would be an image without pixels in training."""
    model, processor = spread_vl
    model = copy.deepcopy(model)
    vision = [model.config.image_token_id, model.config.video_token_id, model.config.vision_start_token_id,
              model.config.vision_end_token_id]
    head = model.lm_head.weight
    head[vision] = head[vision] * 0 + 10 * head.abs().max()
    ids, images = prompt_rows(processor)
    engine = NativeEngine(model, processor.tokenizer)
    greedy_rows = engine.generate(ids, SamplingParams(max_tokens=6, ignore_eos=True), multi_modal_inputs=images)
    sampled = engine.generate(ids, SamplingParams(n=2, temperature=1.0, max_tokens=6, ignore_eos=True, seed=0),
                              multi_modal_inputs=images)
    for completion in greedy_rows + sampled:
        assert not set(completion.token_ids) & set(vision), completion.token_ids


def test_image_tokens_without_their_images_are_refused(spread_vl):
    model, processor = spread_vl
    ids, images = prompt_rows(processor)
    engine = NativeEngine(model, processor.tokenizer)
    with pytest.raises(DataError, match=r"holds [1-9]\d* image tokens but its images make 0"):
        engine.generate(ids[:1], SamplingParams(max_tokens=2))
    with pytest.raises(DataError, match=r"holds 0 image tokens but its images make [1-9]"):
        engine.generate(ids[1:2], SamplingParams(max_tokens=2), multi_modal_inputs=images[:1])


def test_partial_rollouts_of_a_vlm_are_refused_in_one_line(spread_vl):
    """A paused sequence (the async trainer's partial rollout) does not keep its images: refused, naming the fix."""
    from hybridflow.data.batch import Batch
    from hybridflow.errors import RolloutError
    from hybridflow.workers.rollout import RolloutWorker

    model, processor = spread_vl
    ids, images = prompt_rows(processor)
    worker = RolloutWorker(engine=NativeEngine(model, processor.tokenizer),
                           pad_token_id=processor.tokenizer.pad_token_id)
    prompts = Batch.from_dict(tensors={"row": torch.arange(len(ids))},
                              non_tensors={"raw_prompt_ids": ids, "multi_modal_inputs": images})
    with pytest.raises(RolloutError, match="partial_rollout=True with a vision-language policy.*set "
                                           "async_training.partial_rollout=False$"):
        worker.generate(prompts, SamplingParams(max_tokens=2), partial=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.no_grad()
def test_cuda_graph_replay_with_images_equals_hf_generate(spread_vl):
    """On a GPU the decode step replays from CUDA graphs with each row's M-RoPE rotation as one more static input
    (Triton kernels): tokens equal HF generate's and the eager steps', under preemption."""
    model, processor = spread_vl
    model = copy.deepcopy(model).to("cuda")
    ids, images = prompt_rows(processor)
    params = greedy(24, processor.tokenizer, n=2)
    blocks = -(-(max(map(len, ids)) + 24) // BLOCK_SIZE) + 3
    graphed = NativeEngine(model, processor.tokenizer, num_kv_blocks=blocks)
    eager = NativeEngine(model, processor.tokenizer, num_kv_blocks=blocks, enforce_eager=True)
    assert graphed.triton_kernels and not graphed.enforce_eager
    got = graphed.generate(ids, params, multi_modal_inputs=images)
    assert graphed.preemptions > 0 and graphed.graphs is not None
    assert [c.token_ids for c in got] == [c.token_ids for c in eager.generate(ids, params, multi_modal_inputs=images)]
    reference = HFEngine(model, processor.tokenizer).generate(ids, greedy(24, processor.tokenizer),
                                                              multi_modal_inputs=images)
    assert_same_completions(got, reference, n=2)


@torch.no_grad()
def test_an_image_goes_through_the_tower_once_until_the_next_batch(spread_vl, monkeypatch):
    """An agent loop's later turns carry the conversation's images again: the tower's output for an image is kept
    (by its pixels) until a batch starts or the weights change; within one call a repeated image is encoded once."""
    model, processor = spread_vl
    ids, images = prompt_rows(processor)
    engine = NativeEngine(model, processor.tokenizer)
    encoded_counts = []
    tower = type(model.model).get_image_features

    def counting(self, pixel_values, image_grid_thw=None, **kwargs):
        encoded_counts.append(int(image_grid_thw.shape[0]))
        return tower(self, pixel_values, image_grid_thw, **kwargs)

    monkeypatch.setattr(type(model.model), "get_image_features", counting)
    params = greedy(4, processor.tokenizer)
    first = engine.generate(ids + ids[:1], params, multi_modal_inputs=images + images[:1])
    assert encoded_counts == [4]  # rows 0 and 4 share an image: 1 + 2 + 1 distinct images
    again = engine.generate(ids[2:], params, multi_modal_inputs=images[2:])
    assert [(c.token_ids, c.logprobs) for c in again] == [(c.token_ids, c.logprobs) for c in first[2:4]]
    assert encoded_counts == [4]  # all seen
    engine.reset_prefix_cache()  # a new batch (the rollout worker) or new weights (load_weights)
    engine.generate(ids[:1], params, multi_modal_inputs=images[:1])
    assert encoded_counts == [4, 1]
