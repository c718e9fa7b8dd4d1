"""bf16 where the CPU has bf16 units (issue 62): detection, the automatic default and its overrides, the update in
bf16 over fp32 master weights, the CPU engine's dtype. The suite runs with ``HYBRIDFLOW_CPU_BF16=0`` (conftest);
each test here sets the detection it needs, so it passes on AVX2-only, AVX-512 and AVX-512-BF16 CPUs alike."""

from __future__ import annotations

import logging

import pytest
import torch

import hybridflow.cpu as cpu
from hybridflow.errors import ConfigError
from hybridflow.models.fsdp import Precision, resolve_precision
from hybridflow.rollout.precision import cpu_engine_dtype


@pytest.fixture
def detect(monkeypatch):
    """Detection from these /proc/cpuinfo flags (no env override), oneDNN's bf16 support as given."""
    def use(flags: list[str], onednn: bool = True) -> None:
        monkeypatch.delenv(cpu.CPU_BF16_ENV, raising=False)
        monkeypatch.setattr(cpu, "cpu_flags", lambda: flags)
        monkeypatch.setattr(cpu, "onednn_bf16", lambda: onednn)
    return use


# ------------------------------------------------------------------ detection
def test_bf16_units_come_from_the_cpu_flags(detect):
    detect(["fpu", "avx2", "fma"])
    assert cpu.cpu_bf16_units() == [] and not cpu.cpu_has_bf16()  # AVX2-only: the fp32 fallback
    detect(["avx2", "avx512f", "avx512bw"])
    assert not cpu.cpu_has_bf16()  # AVX-512 without its bf16 extension emulates bf16
    detect(["avx2", "avx512f", "avx512_bf16"])
    assert cpu.cpu_bf16_units() == ["avx512_bf16"] and cpu.cpu_has_bf16()
    detect(["avx512_bf16", "amx_bf16"])
    assert cpu.cpu_bf16_units() == ["avx512_bf16", "amx_bf16"]
    assert cpu.cpu_precision_reason() == "this CPU has avx512_bf16 and amx_bf16"
    detect(["avx512_bf16"], onednn=False)
    assert not cpu.cpu_has_bf16()  # the units are there but torch's oneDNN cannot reach them


def test_the_environment_forces_either_way_and_refuses_other_values(detect, monkeypatch):
    detect(["avx512_bf16"])
    monkeypatch.setenv(cpu.CPU_BF16_ENV, "0")
    assert not cpu.cpu_has_bf16() and cpu.cpu_precision_reason() == "HYBRIDFLOW_CPU_BF16=0"
    detect(["avx2"])
    monkeypatch.setenv(cpu.CPU_BF16_ENV, "1")
    assert cpu.cpu_has_bf16()
    monkeypatch.setenv(cpu.CPU_BF16_ENV, "yes")
    with pytest.raises(ConfigError, match="HYBRIDFLOW_CPU_BF16='yes': set it to 0"):
        cpu.cpu_has_bf16()


# ------------------------------------------------------------------ the automatic default and its overrides
def test_unset_precision_on_a_cpu_follows_its_bf16_units(detect, caplog):
    detect(["avx512_bf16"])
    with caplog.at_level(logging.WARNING, logger="hybridflow.models.fsdp"):
        assert resolve_precision(None, device_type="cpu") == Precision(torch.bfloat16, torch.float32)
    assert "CPU training computes in bf16 with fp32 master weights and reductions (this CPU has avx512_bf16)" in \
        caplog.text
    detect(["avx2"])
    assert resolve_precision(None, device_type="cpu") == Precision(None, torch.float32)  # AVX2: unchanged, fp32
    # the user overrides either way
    assert resolve_precision("bf16", device_type="cpu") == Precision(torch.bfloat16)
    detect(["avx512_bf16"])
    assert resolve_precision("fp32", device_type="cpu") == Precision(None)
    assert resolve_precision({"param_dtype": "fp32"}, device_type="cpu") == Precision(None)
    assert resolve_precision(None, fallback="fp32", device_type="cpu") == Precision(None)  # model.dtype=fp32


def test_cpu_engine_dtype_follows_rollout_dtype_and_the_cpu(detect):
    detect(["avx512_bf16"])
    assert cpu_engine_dtype("bfloat16") == torch.bfloat16  # verl's default, where the CPU has bf16 units
    assert cpu_engine_dtype("float32") == torch.float32 and cpu_engine_dtype("fp32") == torch.float32
    assert cpu_engine_dtype("float16") == torch.float32  # no fast fp16 on CPUs
    detect(["avx2"])
    assert cpu_engine_dtype("bfloat16") == torch.float32
    with pytest.raises(ConfigError, match="rollout.dtype='int8' is not a dtype"):
        cpu_engine_dtype("int8")


# ------------------------------------------------------------------ the update in bf16 over fp32 master weights
def test_auto_bf16_update_keeps_fp32_master_weights_optimizer_and_log_probs(tiny_model_dir, monkeypatch):
    from tests.models.test_training_precision import _engine, _linear_output_dtypes
    from tests.workers.test_verl_worker_keys import _batch

    batch = _batch()
    fp32 = _engine(tiny_model_dir)  # conftest's HYBRIDFLOW_CPU_BF16=0: the AVX2 default
    monkeypatch.setenv(cpu.CPU_BF16_ENV, "1")
    bf16 = _engine(tiny_model_dir)
    actor = bf16.actor
    assert {p.dtype for p in actor.model.parameters()} == {torch.float32}
    assert _linear_output_dtypes(actor.model, lambda: actor.compute_log_prob(batch, temperature=1.0)) == \
        {torch.bfloat16}
    assert _linear_output_dtypes(bf16.reference.model, lambda: bf16.reference.compute_ref_log_prob(
        batch, temperature=1.0)) == {torch.bfloat16}
    assert {p.dtype for p in bf16.rollout.engine.model.parameters()} == {torch.bfloat16}  # rollout.dtype=bfloat16
    assert {p.dtype for p in fp32.rollout.engine.model.parameters()} == {torch.float32}
    got, entropy = actor.compute_log_prob(batch, temperature=1.0)
    want, _ = fp32.actor.compute_log_prob(batch, temperature=1.0)
    assert got.dtype == torch.float32 and entropy.dtype == torch.float32  # reductions in fp32
    mask = batch["response_mask"].bool()
    assert not torch.equal(got[mask], want[mask])
    torch.testing.assert_close(got[mask], want[mask], atol=0.1, rtol=0.05)
