"""Official-dir family detection (the official AutoModel order: cosyvoice.yaml, cosyvoice2.yaml,
cosyvoice3.yaml; sheet v2 §1): CosyVoice2/3 dirs go to their registered families, never mis-read
as v1."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from cosyvino.cli.main import main
from cosyvino.errors import ConfigError, ModelDirError
from cosyvino.families import detect_family
from cosyvino.families.official import official_family
from conftest import TINY_A, TINY_C


def test_official_family_by_yaml(tmp_path):
    assert official_family(TINY_A) == "cosyvoice1"
    assert official_family(TINY_C) == "cosyvoice2"
    assert official_family(tmp_path) is None
    assert official_family(tmp_path / "absent") is None
    (tmp_path / "cosyvoice3.yaml").write_text("x: 1\n")
    assert official_family(tmp_path) == "cosyvoice3"
    (tmp_path / "cosyvoice2.yaml").write_text("x: 1\n")
    assert official_family(tmp_path) == "cosyvoice2"  # checked before cosyvoice3.yaml
    (tmp_path / "cosyvoice.yaml").write_text("x: 1\n")
    assert official_family(tmp_path) == "cosyvoice1"  # checked first


def test_detect_family_names_a_v2_dir_instead_of_misreading_it():
    assert detect_family(TINY_C).name == "cosyvoice2"  # the registered, servable family
    assert detect_family(TINY_A).name == "cosyvoice1"


def test_a_v3_yaml_goes_to_the_v3_family_whose_config_reader_names_the_problem(tmp_path):
    (tmp_path / "cosyvoice3.yaml").write_text("x: 1\n")
    family = detect_family(tmp_path)
    assert family.name == "cosyvoice3"
    with pytest.raises((ModelDirError, ConfigError)):
        family.read_config(str(tmp_path))


def test_info_on_a_v2_dir():
    res = CliRunner().invoke(main, ["info", "--model-dir", str(TINY_C), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["family"] == "cosyvoice2" and data["sample_rate"] == 24000
    assert data["servable"].startswith("yes")
    assert data["llm"]["width"] == 32 and data["llm"]["speech_tokens"] == 6561
    assert data["speakers"] == "中文女" and data["voices"] == "alice, bob"
    assert data["files"]["speech_tokenizer_v2.onnx"] == "absent"
    assert set(data["parameters"]) == {"llm.pt", "flow.pt", "hift.pt"}
    assert data["modes"] == "zero_shot, cross_lingual, vc, instruct2, sft"
    assert data["recordings"] == ("no: campplus.onnx, speech_tokenizer_v2.onnx missing (stored "
                                  "and spk2info.pt voices only)")


def test_synth_on_a_v2_dir(tmp_path):
    """A v2 dir is served (it used to be refused): its SFT speaker, 24 kHz."""
    import soundfile as sf

    pytest.importorskip("torch")
    out = tmp_path / "o.wav"
    res = CliRunner().invoke(main, ["synth", "--model-dir", str(TINY_C), "你好", "--seed", "1",
                                    "--output", str(out)])
    assert res.exit_code == 0, res.output
    samples, sr = sf.read(out)
    assert sr == 24000 and samples.size > 0 and samples.size % 960 == 0


def test_info_on_a_v2_dir_without_blank_en(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    shutil.copy(TINY_C / "cosyvoice2.yaml", d)
    res = CliRunner().invoke(main, ["info", "--model-dir", str(d)])
    assert res.exit_code != 0 and "CosyVoice-BlankEN/config.json" in res.output
