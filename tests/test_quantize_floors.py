"""Issue 16 item 3: `cosyvino quantize` records the machine its accuracy was measured on and
refuses a static INT8 stage below its SNR floor (fp32 written instead), on the tiny fixture.

Static INT8 itself is covered by tests/test_quantize_static.py; here ``quantize_static`` is
monkeypatched to return the fp32 IR unchanged (200 dB SNR: the identical-signal value), so
floors above and below 200 dB give both verdicts cheaply and exactly."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("openvino")
pytest.importorskip("nncf")

import planner_trees as trees  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from conftest import TINY_A  # noqa: E402

from cosyvino.cli.main import main  # noqa: E402
from cosyvino.converted import read_manifest, validate_converted_dir  # noqa: E402
from cosyvino.errors import InputError  # noqa: E402
from cosyvino.quantize import CaptureLimits, quantize_model_dir  # noqa: E402
from cosyvino.quantize.calibration import load_calibration_set  # noqa: E402
from cosyvino.quantize.floors import SNR_FLOORS_DB, describe_floor, floor_verdicts  # noqa: E402
from cosyvino.quantize.machine import (  # noqa: E402
    describe,
    effective_flags,
    isa_caps,
    machine_record,
)
from cosyvino.quantize.metrics import SNR_IDENTICAL_DB  # noqa: E402

LIMITS = CaptureLimits(estimator=4, flow_encoder=1, llm_sequences=1, llm_steps=1, vocoder=1)


@pytest.fixture
def unchanged_static(monkeypatch):
    import openvino as ov

    from cosyvino.quantize import model_dir

    monkeypatch.setattr(model_dir, "quantize_static",
                        lambda xml, stage, samples, settings: ov.Core().read_model(xml))


@pytest.fixture(scope="module")
def texts():
    t = load_calibration_set(split="calibration", languages=["en", "zh"], limit_per_language=1)
    return t[:1], t[1:]


# ---- the floors and the verdicts (pure) ------------------------------------------------------
def test_default_floors():
    assert SNR_FLOORS_DB == {"estimator": 45.0, "flow_encoder": 45.0, "vocoder": 25.0}


def test_floor_verdicts():
    audio = {"scopes": {"estimator": {"mean_snr_db": 44.9, "min_snr_db": 40.0},
                        "flow_encoder": {"mean_snr_db": 45.0, "min_snr_db": 44.0},
                        "vocoder": {"mean_snr_db": float("nan"), "min_snr_db": 1.0}}}
    stages = ["flow_encoder", "estimator", "hift_f0", "hift_decode"]
    v = floor_verdicts(stages, audio, SNR_FLOORS_DB, keep=False)
    assert {g: r["verdict"] for g, r in v.items()} == {
        "flow_encoder": "pass", "estimator": "refused", "vocoder": "refused"}  # NaN: refused
    assert v["vocoder"]["stages"] == ["hift_f0", "hift_decode"]
    assert v["estimator"]["snr_db"] == 44.9 and v["estimator"]["min_snr_db"] == 40.0
    kept = floor_verdicts(stages, audio, SNR_FLOORS_DB, keep=True)
    assert kept["estimator"]["verdict"] == "kept"
    assert floor_verdicts(stages, None, SNR_FLOORS_DB, keep=False)["estimator"]["verdict"] == \
        "unmeasured"
    assert floor_verdicts(["llm"], audio, SNR_FLOORS_DB, keep=False) == {}


# ---- the machine record ----------------------------------------------------------------------
def test_int8_weight_mode_by_machine_kind():
    from cosyvino.quantize.model_dir import int8_weight_mode

    zen3 = ["sse4_2", "avx", "avx2", "fma"]
    assert int8_weight_mode("auto", zen3) == "INT8_SYM"
    assert int8_weight_mode("auto", zen3 + ["avx512f", "avx512_vnni"]) == "INT8_ASYM"
    assert int8_weight_mode("auto", zen3 + ["amx_tile", "amx_int8"]) == "INT8_ASYM"
    assert int8_weight_mode("asym", zen3) == "INT8_ASYM"
    assert int8_weight_mode("sym", zen3 + ["avx512_vnni"]) == "INT8_SYM"
    with pytest.raises(InputError, match="int8_weights"):
        int8_weight_mode("int4", zen3)


def test_machine_record_of_a_faked_zen3(tmp_path):
    rec = machine_record(str(trees.zen3_2c(tmp_path)), environ={})
    assert rec["cpu_model"] == "AMD EPYC 7B13" and rec["kind"] == "avx2"
    assert rec["isa_flags"] == {"avx2": True, "avx512f": False, "avx512_vnni": False,
                                "avx_vnni": False, "avx512_bf16": False, "amx_int8": False,
                                "amx_bf16": False}
    assert "isa_caps" not in rec
    assert describe(rec).startswith("AMD EPYC 7B13 (kind avx2): avx2; without avx512f")


def test_machine_record_under_an_isa_cap(tmp_path):
    """ONEDNN_MAX_CPU_ISA / OV_CPU_MAX_ISA make an AMX Xeon dispatch AVX2 kernels: the record
    says so (kind avx2, the uncapped flags kept aside)."""
    root = str(trees.spr_2c(tmp_path))
    env = {"ONEDNN_MAX_CPU_ISA": "avx2", "OV_CPU_MAX_ISA": "AVX2"}
    assert isa_caps(env) == {"ONEDNN_MAX_CPU_ISA": "AVX2", "OV_CPU_MAX_ISA": "AVX2"}
    rec = machine_record(root, environ=env)
    assert rec["kind"] == "avx2" and rec["flags"] == ["avx2", "fma"]
    assert "amx_int8" in rec["cpu_flags"]
    assert "capped by ONEDNN_MAX_CPU_ISA=AVX2" in describe(rec)
    assert machine_record(root, environ={"ONEDNN_MAX_CPU_ISA": "DEFAULT"})["kind"] == "amx"
    vnni = effective_flags(["avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8"],
                           {"X": "AVX512_CORE_VNNI"})
    assert vnni == ["avx2", "avx512_vnni", "avx512f", "fma"]  # AVX-512 caps drop AVX-VNNI
    assert effective_flags(["avx2"], {"X": "NOT_AN_ISA"}) == ["avx2"]


# ---- quantize: refused, passed, kept, unmeasured ---------------------------------------------
def test_stage_below_its_floor_is_written_fp32(converted_dir, texts, tmp_path,
                                               unchanged_static):
    src = converted_dir(TINY_A)
    calib, evals = texts
    out, summary = quantize_model_dir(
        src, str(tmp_path / "int8"), preset="int8", calib_texts=calib, eval_texts=evals,
        eval_tokens=2, speech_tokens=8, limits=LIMITS, show_progress=False,
        snr_floors={"estimator": SNR_IDENTICAL_DB + 1, "flow_encoder": SNR_IDENTICAL_DB - 1})
    m = validate_converted_dir(out)
    src_m = read_manifest(src)
    # refused: the fp32 IR, recorded as fp32, with the reason
    for ext in (".xml", ".bin"):
        rec = m["files"]["estimator" + ext]
        assert rec["precision"] == "fp32" and rec["digest"] == src_m["files"][
            "estimator" + ext]["digest"]
    st = m["quantization"]["stages"]["estimator"]
    assert st["precision"] == "fp32" and st["size_ratio"] == 1.0
    assert st["int8_refused"] == "estimator SNR 200.00 dB < floor 201 dB"
    # above its floor: stays INT8
    assert m["files"]["flow_encoder.bin"]["precision"] == "int8-static"
    floors = m["quantization"]["floors"]
    assert floors["estimator"] == {"stages": ["estimator"], "floor_db": 201.0,
                                   "snr_db": 200.0, "min_snr_db": 200.0, "verdict": "refused"}
    assert floors["flow_encoder"]["verdict"] == "pass"
    # the report is of what was written: no estimator variant any more
    scopes = m["quantization"]["accuracy"]["audio"]["scopes"]
    assert "estimator" not in scopes and "flow_encoder" in scopes
    assert summary["floors"] == floors and summary["stages"]["estimator"]["precision"] == "fp32"
    assert m["quantization"]["machine"] == summary["machine"]
    assert summary["machine"]["kind"] in {"amx", "avx512-bf16", "avx512-vnni", "avx512",
                                          "avx2-vnni", "avx2", "baseline"}
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


def test_cli_says_so_and_keep_below_floor_keeps_int8(converted_dir, texts, tmp_path,
                                                     unchanged_static):
    """CLI: `--hift int8` with a vocoder floor above 200 dB; `--keep-below-floor` keeps the
    INT8 HiFT and the summary warns. A refused run prints the refusal."""
    src = converted_dir(TINY_A)
    base = ["quantize", "--model-dir", src, "--hift", "int8", "--subset", "1",
            "--estimator-samples", "2", "--llm-sequences", "1", "--speech-tokens", "8",
            "--eval-per-language", "1", "--eval-tokens", "2", "--snr-floor", "vocoder=250"]
    res = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "kept"),
                                    "--keep-below-floor"])
    assert res.exit_code == 0, res.output
    assert "warning: hift_f0/hift_decode: INT8 kept BELOW its floor" in res.stdout
    assert "accuracy measured on: " in res.stdout and "(kind " in res.stdout
    m = read_manifest(str(tmp_path / "kept"))
    assert m["files"]["hift_decode.bin"]["precision"] == "int8-static"
    assert m["quantization"]["floors"]["vocoder"]["verdict"] == "kept"
    res = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "refused"), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["floors"]["vocoder"]["verdict"] == "refused"
    assert {summary["stages"][s]["precision"] for s in ("hift_f0", "hift_decode")} == {"fp32"}
    assert "written fp32, INT8 refused: vocoder SNR 200.0 dB" in res.stderr
    assert summary["accuracy"].get("audio") is None  # no audio stage left changed


def test_without_a_report_the_floors_are_unmeasured(converted_dir, texts, tmp_path,
                                                    unchanged_static):
    src = converted_dir(TINY_A)
    out, summary = quantize_model_dir(src, str(tmp_path / "h"), preset="int8-llm-only",
                                      hift="int8", calib_texts=texts[0], speech_tokens=8,
                                      limits=LIMITS, show_progress=False)
    assert summary["floors"]["vocoder"]["verdict"] == "unmeasured"
    line = describe_floor("vocoder", summary["floors"]["vocoder"])
    assert line.endswith("not checked (no audio report: --eval-per-language 0; run again "
                         "without it to check)")
    m = read_manifest(out)
    assert m["quantization"]["floors"]["vocoder"]["verdict"] == "unmeasured"
    assert m["files"]["hift_decode.bin"]["precision"] == "int8-static"


def test_bare_snr_floor_applies_to_the_statically_quantized_stages():
    from cosyvino.cli.quantize import _parse_floors, _resolve_floors

    assert _parse_floors(None, None, ("estimator=40", "30")) == {"*": 30.0}  # bare: all
    floors = _parse_floors(None, None, ("30", "estimator=40"))
    assert _resolve_floors(floors, "int8", "fp32") == {"estimator": 40.0, "flow_encoder": 30.0}
    assert _resolve_floors(floors, "int8-llm-only", "int8") == {"estimator": 40.0,
                                                                 "vocoder": 30.0}
    assert _resolve_floors({"*": 30.0}, "int4-llm", "fp32") == {}


def test_floor_arguments_are_checked(converted_dir, tmp_path):
    src = converted_dir(TINY_A)
    with pytest.raises(InputError, match="no such stage"):
        quantize_model_dir(src, str(tmp_path / "x"), snr_floors={"llm": 1.0},
                           show_progress=False)
    with pytest.raises(InputError, match="quantizes no estimator stage"):
        quantize_model_dir(src, str(tmp_path / "x"), snr_floors={"estimator": 1.0},
                           show_progress=False)
    for bad in ("hifi=3", "estimator=loud", "estimator=nan"):
        res = CliRunner().invoke(main, ["quantize", "--model-dir", src, "--snr-floor", bad])
        assert res.exit_code == 2, (bad, res.output)
    assert os.listdir(tmp_path) == []
