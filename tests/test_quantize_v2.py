"""`cosyvino quantize` on a converted CosyVoice2 dir (the tiny-c fixture): the recipes, the
capture and the report go by graph ROLE, so v2's graphs (``text_embedding`` as the text
encoder, the Qwen2 ``llm`` step, the causal flow) get the v1 treatments: INT8 / INT4 LLM
weights (checked in the IRs' element types), a static INT8 estimator (FakeQuantize nodes), a
report with the floors; the quantized dir synthesizes. A CosyVoice3 dir is refused (typed)."""

from __future__ import annotations

import collections
import json
import math

import numpy as np
import pytest

pytest.importorskip("openvino")
pytest.importorskip("nncf")

from click.testing import CliRunner  # noqa: E402
from conftest import TINY_C, TINY_E  # noqa: E402

from cosyvino.cli.main import main  # noqa: E402
from cosyvino.converted import read_manifest, validate_converted_dir  # noqa: E402
from cosyvino.errors import InputError  # noqa: E402
from cosyvino.families import ROLES, detect_family  # noqa: E402
from cosyvino.quantize import CaptureLimits, quantize_model_dir  # noqa: E402
from cosyvino.quantize.calibration import load_calibration_set  # noqa: E402

#: small enough for a fast test: one calibration and one evaluation text (below), 8 forced
#: speech tokens. The random weights of tiny-c put its INT8 flow graphs far below their
#: floors (estimator ~6 dB, flow encoder ~17 dB; a `make-model --preset tiny` dir: 61 / 76
#: dB), so the floors are measured and the INT8 kept (the refusal itself is
#: tests/test_quantize_floors.py's)
ARGS = ["--subset", "1", "--eval-per-language", "1", "--eval-tokens", "4",
        "--speech-tokens", "8", "--estimator-samples", "10", "--keep-below-floor"]
TEXTS = [{"id": "c-1", "text": "Hello there, this is a calibration sentence.",
          "split": "calibration"},
         {"id": "e-1", "text": "See you tomorrow at noon.", "split": "evaluation"}]


def _constant_types(xml: str) -> collections.Counter:
    import openvino as ov

    model = ov.Core().read_model(xml)
    return collections.Counter(n.get_element_type().get_type_name()
                               for n in model.get_ordered_ops()
                               if n.get_type_name() == "Constant")


def _op_count(xml: str, op: str) -> int:
    import openvino as ov

    return sum(n.get_type_name() == op for n in ov.Core().read_model(xml).get_ordered_ops())


@pytest.fixture(scope="module")
def int8(converted_dir, tmp_path_factory):
    src = converted_dir(TINY_C)
    tmp = tmp_path_factory.mktemp("q2")
    calib = tmp / "texts.jsonl"
    calib.write_text("".join(json.dumps(t) + "\n" for t in TEXTS), encoding="utf-8")
    out = str(tmp / "int8")
    res = CliRunner().invoke(main, ["quantize", "--model-dir", src, "--out", out,
                                    "--calib", str(calib), "--preset", "int8", "--json",
                                    *ARGS])
    assert res.exit_code == 0, res.output
    return src, out, json.loads(res.stdout)


def test_v2_tables_declare_the_roles():
    for fixture, family_name in ((TINY_C, "cosyvoice2"), (TINY_E, "cosyvoice3")):
        family = detect_family(fixture)
        assert family.name == family_name
        roles = family.graphs(family.read_config(str(fixture))).roles
        assert set(roles.values()) <= set(ROLES)
        assert roles["text_embedding"] == "text_encoder" and roles["llm"] == "llm"
        assert roles["speech_embedding"] == "speech_embedding"
        assert {roles[g] for g in ("flow_encoder", "estimator", "hift_f0", "hift_decode")} == \
            {"flow_encoder", "estimator", "hift_f0", "hift_decode"}


def test_v2_int8_writes_int8_weights_and_a_static_estimator(int8):
    src, out, summary = int8
    m = validate_converted_dir(out)
    assert m["family"] == "cosyvoice2"
    prec = {r["stage"]: r["precision"] for r in m["files"].values() if "stage" in r}
    assert prec["llm"] == prec["text_embedding"] == "int8-weights"
    assert prec["estimator"] == prec["flow_encoder"] == "int8-static"
    assert prec["hift_f0"] == prec["hift_decode"] == "fp16"
    # not in the recipe: kept fp32
    assert prec["speech_embedding"] == prec["special_embedding"] == prec["hift_source"] == "fp32"
    stages = m["quantization"]["stages"]
    assert stages["text_embedding"]["role"] == "text_encoder"
    assert stages["llm"]["mode"] in ("INT8_ASYM", "INT8_SYM")
    llm = _constant_types(f"{out}/llm.xml")
    assert llm["u8"] + llm["i8"] > 0 and _constant_types(f"{src}/llm.xml")["u8"] == 0
    assert _constant_types(f"{out}/text_embedding.xml")["u8"] + \
        _constant_types(f"{out}/text_embedding.xml")["i8"] > 0
    assert _op_count(f"{out}/estimator.xml", "FakeQuantize") > 0
    assert _op_count(f"{src}/estimator.xml", "FakeQuantize") == 0
    assert summary["size_ratio"] < 0.6
    # the tokenizer dir (a sub-dir) travels with the quantized dir
    assert "CosyVoice-BlankEN/vocab.json" in m["files"]


def test_v2_int8_report_and_floors(int8):
    _, out, summary = int8
    acc = summary["accuracy"]
    llm = acc["llm"]
    assert llm["texts"] == 1 and llm["positions"] == 4 + 1
    assert 0.0 <= llm["top1_agreement"] <= 1.0 and 0.0 <= llm["mean_kl"] < 0.05
    audio = acc["audio"]
    assert set(audio["scopes"]) == {"flow_encoder", "estimator", "vocoder", "end_to_end"}
    assert audio["overall"] == "end_to_end"
    for sc in audio["scopes"].values():
        assert all(math.isfinite(v) for v in sc.values())
        assert 0.0 < sc["mean_snr_db"] < 200.0  # changed, and not noise
    floors = summary["floors"]
    assert set(floors) == {"estimator", "flow_encoder"}
    for group, v in floors.items():
        assert v["stages"] == [group] and v["floor_db"] == 45.0
        assert v["verdict"] in ("pass", "kept")  # measured; kept: --keep-below-floor
        assert v["snr_db"] == audio["scopes"][group]["mean_snr_db"]
    q = read_manifest(out)["quantization"]
    assert q["floors"] == floors and q["machine"]["kind"]
    assert "per_text" not in q["accuracy"]["audio"]


def test_v2_int8_dir_synthesizes(int8):
    from cosyvino import Synthesizer

    _, out, _ = int8
    tts = Synthesizer(out, backend="openvino", voices_dir=False)
    try:
        audio = tts.synthesize("Hello there.", "中文女", seed=3, num_speech_tokens=12)
    finally:
        tts.close()
    assert audio.sample_rate == 24000 and audio.samples.size > 0
    assert np.all(np.isfinite(audio.samples)) and np.abs(audio.samples).max() <= 1.0
    res = CliRunner().invoke(main, ["synth", "--backend", "openvino", "--model-dir", out,
                                    "-s", "中文女", "--seed", "1", "Hi.", "-o",
                                    f"{out}-cli.wav"])
    assert res.exit_code == 0, res.output


def test_v2_int4_llm_data_aware(converted_dir, tmp_path):
    src = converted_dir(TINY_C)
    texts = load_calibration_set(split="calibration", languages=["en"], limit_per_language=1)
    out, summary = quantize_model_dir(
        src, str(tmp_path / "int4"), preset="int4-llm", calib_texts=texts, speech_tokens=4,
        limits=CaptureLimits(llm_sequences=1, llm_steps=3), show_progress=False)
    st = summary["stages"]["llm"]
    assert st["precision"] == "int4-weights" and st["data_aware"] is True
    assert st["dataset_items"] == 1 + 3  # the prefix, then 3 decode rows
    types = _constant_types(f"{out}/llm.xml")
    assert types["u4"] + types["i4"] > 0
    prec = {r["stage"]: r["precision"] for r in read_manifest(out)["files"].values()
            if "stage" in r}
    assert prec["estimator"] == prec["text_embedding"] == "fp32"


def test_v3_is_refused_with_a_typed_error(tmp_path):
    with pytest.raises(InputError, match="'cosyvoice3' model.*'cosyvoice1', 'cosyvoice2'"):
        quantize_model_dir(str(TINY_E), str(tmp_path / "q"), show_progress=False)
    res = CliRunner().invoke(main, ["quantize", "--model-dir", str(TINY_E), "--out",
                                    str(tmp_path / "q")])
    assert res.exit_code == 2 and "cosyvoice3" in res.output
    assert not (tmp_path / "q").exists()
