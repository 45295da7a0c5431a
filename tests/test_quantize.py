"""`cosyvino quantize` (first slice: NNCF weight-only INT8 of the LLM) on the tiny model:
output is a valid converted dir, the LLM .bin shrinks, INT8 synthesis runs, the accuracy
report is complete and finite, the --max-kl guard leaves nothing behind."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

pytest.importorskip("openvino")
pytest.importorskip("nncf")

from click.testing import CliRunner  # noqa: E402
from conftest import TINY_A  # noqa: E402

from cosyvino import Synthesizer  # noqa: E402
from cosyvino.cli.main import main  # noqa: E402
from cosyvino.converted import read_manifest, sha256_file, validate_converted_dir  # noqa: E402

EVAL = ["--eval-per-language", "1", "--eval-tokens", "6"]


@pytest.fixture(scope="module")
def quantized(converted_dir, tmp_path_factory):
    src = converted_dir(TINY_A)
    out = str(tmp_path_factory.mktemp("q") / "int8")
    res = CliRunner().invoke(main, ["quantize", "--model-dir", src, "--out", out, "--json",
                                    *EVAL])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output[res.output.index("{"):])
    return src, out, summary


def test_output_is_a_valid_converted_dir(quantized):
    src, out, summary = quantized
    m = validate_converted_dir(out)
    src_m = read_manifest(src)
    assert set(m["files"]) == set(src_m["files"])
    assert m["files"]["llm.bin"]["precision"] == "int8-weights"
    assert m["files"]["llm.xml"]["precision"] == "int8-weights"
    assert m["files"]["estimator.bin"] == src_m["files"]["estimator.bin"]
    q = m["quantization"]
    assert q["preset"] == "int8-llm-only"
    # --int8-weights auto: the mode this machine kind gets (sym without int8 dot products)
    from cosyvino.quantize.machine import machine_record
    from cosyvino.quantize.model_dir import int8_weight_mode

    assert summary["stages"]["llm"]["mode"] == int8_weight_mode("auto", machine_record()["flags"])
    assert q["source_manifest_sha256"] == sha256_file(os.path.join(src, "manifest.json"))
    assert not [n for n in os.listdir(os.path.dirname(out)) if n.startswith(".")]


def test_llm_bin_smaller(quantized):
    src, out, summary = quantized
    fp32 = os.path.getsize(os.path.join(src, "llm.bin"))
    int8 = os.path.getsize(os.path.join(out, "llm.bin"))
    ratio = int8 / fp32
    print(f"tiny LLM .bin: fp32 {fp32} B, int8 {int8} B, ratio {ratio:.2f}")
    assert ratio < 0.5
    assert summary["stages"]["llm"]["size_ratio"] == pytest.approx(ratio)


def test_report_fields_finite(quantized):
    rep = quantized[2]["accuracy"]["llm"]
    for key in ("top1_agreement", "mean_kl", "max_kl"):
        assert math.isfinite(rep[key])
    assert 0.0 <= rep["top1_agreement"] <= 1.0
    assert rep["mean_kl"] >= 0.0
    assert rep["texts"] == len(rep["per_text"]) == 5  # one held-out text per language
    assert rep["positions"] == 5 * 7
    for row in rep["per_text"]:
        assert {"id", "language", "top1_agreement", "mean_kl", "max_kl"} <= set(row)


def test_int8_synthesis_runs(quantized):
    src, out, _ = quantized
    runs = []
    for d in (src, out):
        tts = Synthesizer(d, backend="openvino", cache_dir="")
        audio = tts.synthesize("Hello world.", tts.speakers[0], seed=0, num_speech_tokens=25)
        assert audio.stats["speech_tokens"] == 25
        assert np.all(np.isfinite(audio.samples))
        runs.append(audio)
    assert len(runs[1].samples) == len(runs[0].samples) > 0  # forced tokens fix the length


def test_guard_rejects_impossible_threshold(converted_dir, tmp_path):
    src = converted_dir(TINY_A)
    out = tmp_path / "int8"
    res = CliRunner().invoke(main, ["quantize", "--model-dir", src, "--out", str(out),
                                    "--max-kl", "0", *EVAL])
    assert res.exit_code == 1, res.output
    assert "exceeds --max-kl" in res.output
    assert not out.exists()
    assert os.listdir(tmp_path) == []


def test_bench_subdir_spec():
    from cosyvino.cli.bench import _split_subdir

    assert _split_subdir("openvino@openvino-int8-llm:u8kv") == ("openvino:u8kv",
                                                               "openvino-int8-llm")
    assert _split_subdir("openvino") == ("openvino", None)
