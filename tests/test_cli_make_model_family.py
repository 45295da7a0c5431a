"""`cosyvino make-model` picks the family from --family or the preset (not hard-coded v1):
each family lists its presets (ModelFamily.presets) and writes them (make_synthetic); the
registered CosyVoice2 family makes ``tiny`` and ``0.5b``."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cosyvino import families
from cosyvino.cli.main import main, synthetic_family
from cosyvino.errors import InputError, ModelDirError


@pytest.fixture
def with_v2():
    """The registered families: CosyVoice2 registers its presets through its family class."""
    classes = families.family_classes()
    assert classes["cosyvoice2"] is families.get_family("cosyvoice2")
    return classes


def test_cosyvoice2_family_lists_and_makes_its_presets(tmp_path, monkeypatch):
    """``CosyVoice2.presets`` / ``make_synthetic`` delegate to :mod:`presets` /
    :func:`synthetic.make_model` (arguments passed through as given)."""
    from cosyvino.families.cosyvoice2 import synthetic

    fam = families.get_family("cosyvoice2")
    assert fam.presets() == ("tiny", "0.5b")
    calls = []
    monkeypatch.setattr(synthetic, "make_model",
                        lambda preset, out, **kw: calls.append((preset, out, kw)) or out)
    assert fam.make_synthetic("0.5b", str(tmp_path), seed=7, overwrite=True) == str(tmp_path)
    assert calls == [("0.5b", str(tmp_path), {"seed": 7, "overwrite": True})]


def test_family_from_preset_or_option(with_v2):
    assert synthetic_family(None, "tiny").name == "cosyvoice1"  # the default family first
    assert synthetic_family(None, "300m").name == "cosyvoice1"
    assert synthetic_family(None, "0.5b").name == "cosyvoice2"
    assert synthetic_family("cosyvoice2", "tiny").name == "cosyvoice2"
    assert synthetic_family("cosyvoice1", "tiny").name == "cosyvoice1"


def test_bad_family_or_preset_is_a_typed_error(with_v2):
    with pytest.raises(InputError, match=r"family 'cosyvoice2' has no preset '300m'.*"
                                         r"cosyvoice1: tiny, 300m; cosyvoice2: tiny, 0.5b"):
        synthetic_family("cosyvoice2", "300m")
    with pytest.raises(InputError, match="unknown preset 'huge'"):
        synthetic_family(None, "huge")
    with pytest.raises(ModelDirError, match="unknown model family 'cosyvoice9'"):
        synthetic_family("cosyvoice9", "tiny")
    r = CliRunner().invoke(main, ["make-model", "--preset", "huge", "out"])
    assert r.exit_code == 2 and "unknown preset 'huge'" in r.output


def test_make_model_cli_writes_a_cosyvoice2_dir(with_v2, tmp_path):
    pytest.importorskip("torch")
    from cosyvino.families.cosyvoice2.config import read_cosyvoice2_config
    from cosyvino.families.cosyvoice2.synthetic import is_synthetic

    out = tmp_path / "v2"
    r = CliRunner().invoke(main, ["make-model", "--family", "cosyvoice2", "--preset", "tiny",
                                  "--seed", "5", str(out)])
    assert r.exit_code == 0, r.output
    assert "wrote synthetic cosyvoice2 tiny model" in r.output
    assert is_synthetic(out) and "seed 5" in (out / "cosyvoice2.yaml").read_text()[:200]
    assert read_cosyvoice2_config(out).llm.qwen.hidden_size == 32
    assert not (out / "cosyvoice.yaml").exists()


def test_make_model_cli_0_5b_goes_through_the_family(tmp_path, monkeypatch):
    """``--preset 0.5b`` (no --family) reaches CosyVoice2.make_synthetic with the CLI's
    options (the 2.6 GB write itself: test_cosyvoice2_synthetic, COSYVINO_TEST_FULL_SIZE=1)."""
    pytest.importorskip("torch")
    from cosyvino.families.cosyvoice2 import synthetic

    calls = []
    monkeypatch.setattr(synthetic, "make_model",
                        lambda preset, out, **kw: calls.append((preset, out, kw)) or out)
    out = str(tmp_path / "big")
    r = CliRunner().invoke(main, ["make-model", "--preset", "0.5b", "--seed", "2", out])
    assert r.exit_code == 0, r.output
    assert "wrote synthetic cosyvoice2 0.5b model" in r.output
    [(preset, path, kw)] = calls
    assert (preset, path, kw["seed"], kw["hift_weight_norm"], kw["overwrite"]) == \
        ("0.5b", out, 2, "parametrizations", False)
    assert callable(kw["progress"])
