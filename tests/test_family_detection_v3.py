"""A CosyVoice3 dir is recognised as such (official AutoModel order, sheet v3 §1): detected as the
registered ``cosyvoice3`` family, summarized by ``cosyvino info``, its spk2info read with the
shared v2/v3 reader."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from cosyvino.cli.main import main
from cosyvino.errors import ModelDirError
from cosyvino.families import detect_family, get_family
from cosyvino.families.official import official_family
from conftest import TINY_E


def test_official_family_of_tiny_e():
    assert official_family(TINY_E) == "cosyvoice3"


def test_detect_family_serves_a_v3_dir():
    family = detect_family(TINY_E)
    assert family.name == "cosyvoice3" and family is get_family("cosyvoice3")


def test_detect_family_without_the_v3_family_still_names_the_dir(monkeypatch):
    """Were the v3 family not registered (a trimmed plugin set), the dir is named, not
    misread as v1."""
    from cosyvino.families import family_classes

    classes = {k: v for k, v in family_classes().items() if k != "cosyvoice3"}
    monkeypatch.setattr("cosyvino.families.family_classes", lambda: classes)
    with pytest.raises(ModelDirError, match="CosyVoice3 model dir \\(cosyvoice3.yaml\\).*cannot "
                                            "serve CosyVoice3 yet") as e:
        detect_family(TINY_E)
    assert e.value.path == str(TINY_E)


def test_info_on_a_v3_dir():
    res = CliRunner().invoke(main, ["info", "--model-dir", str(TINY_E), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["family"] == "cosyvoice3" and data["sample_rate"] == 24000
    assert data["llm"]["width"] == 32 and data["llm"]["speech_tokens"] == 6561
    assert data["llm"]["speech_head_rows"] == 6761
    assert data["speakers"] == "中文女" and data["voices"] == "alice, bob"
    assert data["files"]["speech_tokenizer_v3.onnx"] == "absent"
    assert set(data["parameters"]) == {"llm.pt", "flow.pt", "hift.pt"}
    assert data["servable"].startswith("yes")


def test_info_on_a_v3_dir_without_blank_en(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "cosyvoice3.yaml").write_text((TINY_E / "cosyvoice3.yaml").read_text(encoding="utf-8"),
                                       encoding="utf-8")
    res = CliRunner().invoke(main, ["info", "--model-dir", str(d)])
    assert res.exit_code != 0 and "CosyVoice-BlankEN/config.json" in res.output
    assert "Traceback" not in res.output


def test_tiny_e_speakers():
    torch = pytest.importorskip("torch")
    from cosyvino.families.cosyvoice23.speakers import load_spk2info

    raw = torch.load(TINY_E / "spk2info.pt", weights_only=True)
    speakers = load_spk2info(TINY_E / "spk2info.pt")
    assert list(speakers) == ["中文女", "alice", "bob"]
    assert speakers["中文女"].bundle is None and speakers["中文女"].embedding.shape == (1, 192)
    for name, n_text, n_tokens in (("alice", 10, 20), ("bob", 8, 31)):
        b = speakers[name].bundle
        assert b.prompt_text_token.shape == (n_text,)
        assert b.llm_prompt_speech_token.shape == b.flow_prompt_speech_token.shape == (n_tokens,)
        assert b.prompt_speech_feat.shape == (2 * n_tokens, 80)
        np.testing.assert_array_equal(b.llm_prompt_speech_token,
                                      raw[name]["llm_prompt_speech_token"][0].numpy())
        np.testing.assert_array_equal(b.flow_embedding, raw[name]["flow_embedding"].numpy())
