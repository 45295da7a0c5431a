"""cosyvino.bench_extras and the OpenVINO kernel summary: peak arithmetic, ISA classes, the
ODE-step rows, the neighbour process."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from cosyvino.bench_extras import (busy_neighbour, estimator_gflop, estimator_peak,
                                   fma_peak_gflops, int8_peak_gops, measure_ode_steps,
                                   neighbour_markdown, ode_markdown)


@pytest.mark.parametrize("flags, vendor, per", [
    ({"avx2", "fma", "avx512f"}, "GenuineIntel", 64),
    ({"avx2", "fma", "avx512f"}, "AuthenticAMD", 32),  # Zen 4: 512-bit FMAs on 256-bit pipes
    ({"avx2", "fma"}, "AuthenticAMD", 32),
    ({"sse4_2"}, "GenuineIntel", 8),
])
def test_fma_peak(flags, vendor, per):
    gflops, desc = fma_peak_gflops(flags, vendor, 2000.0, 2)
    assert gflops == pytest.approx(2 * 2.0 * per)
    assert f"{per} FLOP/cycle" in desc
    assert fma_peak_gflops(flags, vendor, None, 2)[0] is None


@pytest.mark.parametrize("flags, vendor, per", [
    ({"avx512f", "avx512_vnni", "amx_int8"}, "GenuineIntel", 2048),  # AMX: TMUL
    ({"avx512f", "avx512_vnni"}, "GenuineIntel", 256),  # 4 x the 64 FLOP/cycle FMA peak
    ({"avx512f", "avx512_vnni"}, "AuthenticAMD", 128),  # Zen 4: 256-bit pipes
    ({"avx2", "fma", "avx_vnni"}, "GenuineIntel", 128),
])
def test_int8_peak(flags, vendor, per):
    gops, desc = int8_peak_gops(flags, vendor, 2000.0, 2)
    assert gops == pytest.approx(2 * 2.0 * per)
    assert f"{per} int8 ops/cycle" in desc
    assert int8_peak_gops(flags, vendor, None, 2)[0] is None


def test_int8_peak_needs_dot_products():
    gops, desc = int8_peak_gops({"avx2", "fma"}, "AuthenticAMD", 2000.0, 2)
    assert gops is None and "no int8 dot products" in desc


def test_estimator_peak_follows_the_weights():
    flags = {"avx2", "fma", "avx512f", "avx512_vnni"}
    assert estimator_peak("int8-static", flags, "GenuineIntel", 2000.0, 1)[0] == 512.0
    for weights in (None, "fp32", "fp16"):
        assert estimator_peak(weights, flags, "GenuineIntel", 2000.0, 1) == (
            128.0, "fp32 FMA, AVX-512: 1 x 2.0 GHz x 64 FLOP/cycle")


def test_isa_classes():
    isa_of = pytest.importorskip("cosyvino_openvino.kernels").isa_of
    assert isa_of("brgemm_avx512_amx_bf16") == "AMX"
    assert isa_of("jit_avx512_i8") == "AVX-512"
    assert isa_of("jit_avx2_f32") == "AVX2"
    assert isa_of("gemm_mlas_f32") == "MLAS"
    assert isa_of("ref_any_f32") == "reference"
    assert isa_of("unknown_dynamic") is None and isa_of("undef_f32") is None


def test_estimator_flops_scale_with_frames(tiny_model_dir):
    pytest.importorskip("torch")
    from cosyvino.families.cosyvoice1.yaml_config import read_model_config

    cfg = read_model_config(os.path.join(tiny_model_dir, "cosyvoice.yaml"))
    a, b = estimator_gflop(cfg, 50), estimator_gflop(cfg, 100)
    assert a > 0
    # convolutions and linears are linear in T, attention quadratic: between 2x and 4x
    assert 2.0 <= b / a <= 4.0


def test_ode_steps_rows(tiny_model_dir):
    from cosyvino import Synthesizer

    tts = Synthesizer(tiny_model_dir, backend="torch")
    rows = measure_ode_steps(tts, "你好，世界。", "中文女", 20, [5, 10, 2])
    assert [r["n_timesteps"] for r in rows] == [10, 5, 2]  # the model's 10 once, first
    assert rows[0]["mel_l1"] == 0.0 and rows[0]["lsd_db"] == 0.0
    assert 0 < rows[1]["mel_l1"] < rows[2]["mel_l1"]  # fewer steps, further away
    table = ode_markdown([{"label": "torch", "ode_steps": rows}])
    assert table.count("| torch |") == 3


def test_neighbour_markdown_ratios():
    mean = {"total_s": 2.0, "llm_ms_per_token": 10.0, "estimator_ms_per_call": 100.0,
            "vocoder_ms": 50.0}
    loud = {k: 3 * v for k, v in mean.items()}
    text = neighbour_markdown([{"label": "x", "mean": mean},
                               {"label": "x +neighbour", "mean": loud}])
    assert "| x | 3.00x | 3.00x | 3.00x | 3.00x |" in text
    assert neighbour_markdown([{"label": "x", "mean": mean}]) == ""


def test_busy_neighbour_runs_and_stops():
    psutil = pytest.importorskip("psutil")
    before = {p.pid for p in psutil.Process().children()}
    with busy_neighbour(limit_s=30) as cpu:
        time.sleep(0.3)
        kids = [p for p in psutil.Process().children() if p.pid not in before]
        assert len(kids) == 1 and kids[0].is_running()
        assert cpu in os.sched_getaffinity(0)
        assert kids[0].cpu_affinity() == [cpu]
    assert not kids[0].is_running() or kids[0].status() == psutil.STATUS_ZOMBIE


def test_cpuinfo_fields(tmp_path):
    from cosyvino.bench_extras import cpu_clock_mhz, cpuinfo_field

    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu MHz\t\t: 2450.000\n", encoding="utf-8")
    assert cpuinfo_field("vendor_id", str(tmp_path)) == "AuthenticAMD"
    assert cpu_clock_mhz(str(tmp_path)) == 2450.0
    assert cpuinfo_field("flags", str(tmp_path)) is None
    assert cpu_clock_mhz(str(tmp_path / "nowhere")) is None


def test_cpu_summary_names_the_model_and_the_kernel_isas(tmp_path):
    from cosyvino.bench_extras import cpu_summary

    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(
        "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx2 fma hypervisor\n", encoding="utf-8")
    assert cpu_summary(str(tmp_path)) == "AMD EPYC 7B13 (avx2)"
    (tmp_path / "proc" / "cpuinfo").write_text("processor\t: 0\n", encoding="utf-8")
    assert cpu_summary(str(tmp_path)) == "unknown CPU (no AVX2)"


def test_join_mask_marks_frames_around_each_join_only():
    from cosyvino.bench_extras import join_mask

    # chunks of 10, 20 and 5 frames: joins at frames 10 and 30
    near = join_mask([10 * 256, 20 * 256, 5 * 256], 35, width=2)
    assert list(np.flatnonzero(near)) == [8, 9, 10, 11, 28, 29, 30, 31]
    assert not join_mask([35 * 256], 35).any()          # one chunk: no join
    assert join_mask([256, 256], 3, width=5).all()      # clipped at both ends


def test_log_mel_frames_shape():
    from cosyvino.bench_extras import log_mel_frames

    mel = log_mel_frames(np.zeros(22050, np.float32) + 0.01, 22050)
    assert mel.dtype == np.float64 and mel.shape[0] == 80 and 80 <= mel.shape[1] <= 87
