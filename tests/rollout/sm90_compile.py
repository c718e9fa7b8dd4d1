"""Compile the decode-attention kernels for sm_90 (H100 / H200) on a machine without a GPU, as the GPU would.

Run as a script with ``TRITON_INTERPRET`` unset (the interpreter's ``triton.jit`` cannot compile):
``python tests/rollout/sm90_compile.py GROUP HEAD_DIM CONFIG...`` (the paged decode kernel of
:mod:`~hybridflow.rollout.triton_attention`) or ``python tests/rollout/sm90_compile.py mla HEADS RANK ROPE CONFIG...``
(MLA's, :mod:`~hybridflow.rollout.triton_mla`), with each ``CONFIG`` a :class:`DecodeConfig`
as ``split_len,block_n,num_warps,num_stages,kv_together,unrolled`` (``1``/``0`` for the booleans); prints one JSON
line a config: registers a thread (``cuobjdump -res-usage`` on the cubin), shared memory, and the shared-memory
buffers the software pipeliner made (``"1x64x128xbf16"``: one stage ahead of a 64 x 128 tile).
"""

import json
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from hybridflow.rollout import triton_attention, triton_mla
from hybridflow.rollout.triton_attention import DecodeConfig

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def compile_split_kernel(config: DecodeConfig, *, group: int, head_dim: int, span: int = 2048) -> dict:
    kernel = triton_attention._split_kernel
    direct = config.splits(span) == 1
    pointers = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "Lengths": "*i64", "Tables": "*i32", "Out": "*bf16",
                "Sinks": "*fp32",
                "PartOut": "*bf16" if direct else "*fp32", "PartLse": "*bf16" if direct else "*fp32"}
    constexprs = dict(GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
                      BLOCK_N=config.block_n, SPLIT_LEN=config.split_len, PAGE=16, PRECISION="tf32", SOFTCAP=False,
                      SINKS=False, NUM_STAGES=config.num_stages, KV_TOGETHER=config.kv_together,
                      UNROLLED=config.unrolled, DIRECT=direct, INTERPRETED=False)
    return compile_kernel(kernel, pointers, constexprs, config)


def compile_mla_kernel(config: DecodeConfig, *, heads: int, rank: int, rope: int, span: int = 2048) -> dict:
    """MLA's split kernel at ``heads`` heads over ``[c | k_pe]`` entries ``rank + rope`` wide (bf16)."""
    kernel = triton_mla._mla_split_kernel
    direct = config.splits(span) == 1
    pointers = {"Q": "*bf16", "Latents": "*bf16", "Lengths": "*i64", "Tables": "*i32", "Out": "*bf16",
                "PartOut": "*bf16" if direct else "*fp32", "PartLse": "*bf16" if direct else "*fp32"}
    constexprs = dict(HEADS=heads, BLOCK_H=triton_mla.BLOCK_H, RANK=rank, BLOCK_R=max(16, triton.next_power_of_2(rank)),
                      ROPE=rope, BLOCK_P=max(16, triton.next_power_of_2(rope)), BLOCK_N=config.block_n,
                      SPLIT_LEN=config.split_len, PAGE=16, PRECISION="tf32", NUM_STAGES=config.num_stages,
                      DIRECT=direct, INTERPRETED=False)
    return compile_kernel(kernel, pointers, constexprs, config)


def compile_kernel(kernel, pointers: dict, constexprs: dict, config: DecodeConfig) -> dict:
    """Compile ``kernel`` for sm_90 with these pointer types and constants; registers, shared memory, buffers."""
    params = list(kernel.arg_names)
    signature = {name: "constexpr" if name in constexprs else pointers.get(name, "fp32" if name in ("scale", "softcap")
                                                                               else "i32") for name in params}
    aligned = [[["tt.divisibility", 16]]]  # pointers and strides as the engine's tensors give them
    source = ASTSource(kernel, signature, constexprs={(params.index(k),): v for k, v in constexprs.items()},
                       attrs={(params.index(name),): aligned[0] for name in params
                              if name.startswith("stride") or name in pointers})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=config.num_warps, num_stages=config.num_stages))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([CUOBJDUMP, "-res-usage", cubin.name], capture_output=True, text=True,
                               check=True).stdout
    return {"registers": int(re.search(r"REG:(\d+)", usage).group(1)), "shared": compiled.metadata.shared,
            "buffers": sorted(set(re.findall(r"!ttg\.memdesc<(\d+x\d+x\d+x(?:bf16|f32))", compiled.asm["ttgir"])))}


def main(argv: list[str]) -> None:
    if argv[0] == "mla":
        heads, rank, rope = (int(part) for part in argv[1:4])
        compile_one = lambda config: compile_mla_kernel(config, heads=heads, rank=rank, rope=rope)  # noqa: E731
        specs = argv[4:]
    else:
        group, head_dim = int(argv[0]), int(argv[1])
        compile_one = lambda config: compile_split_kernel(config, group=group, head_dim=head_dim)  # noqa: E731
        specs = argv[2:]
    for spec in specs:
        split_len, block_n, warps, stages, together, unrolled = (int(part) for part in spec.split(","))
        config = DecodeConfig(split_len=split_len, block_n=block_n, num_warps=warps, num_stages=stages,
                              kv_together=bool(together), unrolled=bool(unrolled))
        print(json.dumps({"config": spec, **compile_one(config)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
