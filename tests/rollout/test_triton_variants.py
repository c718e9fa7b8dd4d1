"""The Triton decode kernels for the architectures of issue 58, against torch references: gpt-oss's attention sinks
(with its sliding windows) and GLM-4.5's partial rotary in the fused step. Compiled on a GPU, interpreted on CPU
(tests/conftest.py sets ``TRITON_INTERPRET=1`` where CUDA is absent). Skipped without Triton."""

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.triton

from hybridflow.rollout.decoder import _apply_rope  # noqa: E402
from hybridflow.rollout.triton_attention import DecodeConfig, paged_decode_attention  # noqa: E402
from hybridflow.rollout.triton_fused import qkv_rope_write  # noqa: E402
from tests.rollout.test_triton_kernels import fused_equals_torch_step, reference_attention, scattered_tables  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("config", [None, DecodeConfig(split_len=64, block_n=32)])  # one split a row; several
@pytest.mark.parametrize("window", [None, 1, 70])
def test_sinks_join_each_heads_softmax_once_across_splits_and_windows(config, window):
    """Sinks from well below to well above the scores (a sink of +6 takes most of the weight), rows of 1 key to
    several splits, poisoned blocks no row may read; and a sink that is not one per head is refused."""
    torch.manual_seed(3)
    heads, kv_heads, head_dim, block_size = 6, 2, 32, 16
    lengths = [1, 15, 64, 65, 200]
    tables, blocks = scattered_tables(lengths, block_size=block_size, width=16, seed=3)
    q = torch.randn(len(lengths), heads, head_dim)
    keys, values = torch.randn(2, kv_heads, blocks, block_size, head_dim)
    keys[:, 0] = values[:, 0] = float("nan")
    sinks = torch.tensor([-4.0, -1.0, 0.0, 0.5, 2.0, 6.0])
    got = paged_decode_attention(q=q.to(DEVICE), keys=keys.to(DEVICE), values=values.to(DEVICE),
                                 lengths=torch.tensor(lengths, device=DEVICE), scale=head_dim**-0.5,
                                 block_tables=tables.to(DEVICE), window=window, sinks=sinks.to(DEVICE), config=config)
    expected = reference_attention(q, keys, values, lengths, head_dim**-0.5, tables.long(), window=window, sinks=sinks)
    torch.testing.assert_close(got.cpu().double(), expected, rtol=1e-5, atol=1e-5)
    without = paged_decode_attention(q=q.to(DEVICE), keys=keys.to(DEVICE), values=values.to(DEVICE),
                                     lengths=torch.tensor(lengths, device=DEVICE), scale=head_dim**-0.5,
                                     block_tables=tables.to(DEVICE), window=window, config=config)
    assert (without.cpu() - got.cpu()).abs().max() > 0.1  # the sinks change what a head attends to
    with pytest.raises(ValueError, match="sinks of shape"):
        paged_decode_attention(q=q.to(DEVICE), keys=keys.to(DEVICE), values=values.to(DEVICE),
                               lengths=torch.tensor(lengths, device=DEVICE), scale=1.0,
                               block_tables=tables.to(DEVICE), sinks=sinks[:2].to(DEVICE))


def test_gpt_oss_fused_decode_step_equals_the_torch_step(tiny_tokenizer):
    """gpt-oss (sinks of std 1, a window of 8 on the first layer, prompts longer than it) through the Triton step."""
    from hybridflow.models.tiny import build_tiny_model

    model, tokenizer = build_tiny_model("gpt_oss", seed=1, tokenizer=tiny_tokenizer)
    decoder = fused_equals_torch_step(model, tokenizer)
    assert decoder.layers[0].sinks is not None and decoder.layers[0].window == 8


@pytest.mark.parametrize("kernels", ["triton", "c"])
@pytest.mark.parametrize("with_norm", [False, True])
def test_qkv_rope_write_turns_only_the_rotary_part_of_each_head(kernels, with_norm):
    """GLM-4.5's partial rotary: tables 8 wide on heads of 32 turn dimensions 0..7 (pairs i, i + 4) and leave 8..31
    as they are (normalised first where the head has a norm), for the Triton kernel and the C one alike."""
    if kernels == "c":
        from hybridflow.rollout import cpu_fused, cpu_kernels

        if cpu_kernels.library() is None:
            pytest.skip("no C compiler: the kernels are not built")
        write, device = cpu_fused.qkv_rope_write, "cpu"
    else:
        write, device = qkv_rope_write, DEVICE
    torch.manual_seed(2)
    rows, heads, kv_heads, head_dim, rotary, block_size = 3, 4, 2, 32, 8, 4
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * head_dim)
    positions = torch.tensor([0, 5, 9])
    tables = torch.tensor([[3, 0, 0], [1, 4, 0], [5, 2, 6]], dtype=torch.int32)  # 9 -> block 6, offset 1
    angles = torch.arange(12)[:, None] * torch.rand(rotary // 2)[None]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    norm = torch.rand(heads + kv_heads, head_dim) + 0.5 if with_norm else None
    keys, values = torch.zeros(2, kv_heads, 7, block_size, head_dim)
    moved = [t.to(device) for t in (qkv, positions, cos, sin, keys, values, tables)]
    q = write(qkv=moved[0], positions=moved[1], cos=moved[2], sin=moved[3], keys=moved[4], values=moved[5],
              qk_norm=None if norm is None else norm.to(device), heads=heads, eps=1e-6, block_tables=moved[6])
    qk = qkv[:, : (heads + kv_heads) * head_dim].view(rows, heads + kv_heads, head_dim)
    if with_norm:
        qk = norm * (qk * torch.rsqrt(qk.pow(2).mean(-1, keepdim=True) + 1e-6))
    expected = qk.clone()
    c, s = cos[positions][:, None], sin[positions][:, None]  # the rotation by hand: (x0, x4), (x1, x5), ..
    expected[..., :4] = qk[..., :4] * c[..., :4] - qk[..., 4:8] * s[..., :4]
    expected[..., 4:8] = qk[..., 4:8] * c[..., 4:] + qk[..., :4] * s[..., 4:]
    torch.testing.assert_close(expected, _apply_rope(qk, c, s))  # the torch step's rope, the same numbers
    torch.testing.assert_close(q.cpu(), expected[:, :heads], rtol=1e-5, atol=1e-5)
    if not with_norm:
        assert torch.equal(q.cpu()[..., rotary:], qk[:, :heads, rotary:])  # passed through untouched
    for n, (block, offset) in enumerate([(3, 0), (4, 1), (6, 1)]):
        torch.testing.assert_close(moved[4].cpu()[:, block, offset], expected[n, heads:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", [{}, dict(use_qk_norm=True, attention_bias=True)])
def test_glm4_moe_fused_decode_step_equals_the_torch_step(variant):
    """GLM-4.5 (rotary on 8 of 16 dimensions; q / k norms and biases in the second variant; grouped experts in the
    graph-safe path) through the Triton step."""
    from tests.rollout.test_glm4_moe import glm

    model, tokenizer = glm(seed=1, **variant)
    decoder = fused_equals_torch_step(model, tokenizer)
    assert decoder.rotary_dim == 8 and decoder.head_dim == 16
