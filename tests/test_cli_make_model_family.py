"""`cosyvino make-model` picks the family from --family or the preset (not hard-coded v1):
each family lists its presets (ModelFamily.presets) and writes them (make_synthetic)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cosyvino import families
from cosyvino.cli.main import main, synthetic_family
from cosyvino.errors import InputError, ModelDirError


class _CosyVoice2Presets:
    """The CosyVoice2 family's synthetic hooks, for runs where the family is not registered
    yet (the family class delegates to the same module)."""

    name = "cosyvoice2"

    @classmethod
    def presets(cls):
        from cosyvino.families.cosyvoice2.presets import PRESETS

        return tuple(PRESETS)

    @classmethod
    def make_synthetic(cls, preset, out_dir, **kwargs):
        from cosyvino.families.cosyvoice2.synthetic import make_model

        return make_model(preset, out_dir, **kwargs)


@pytest.fixture
def with_v2(monkeypatch):
    """The registered families, plus CosyVoice2's presets when no cosyvoice2 family is
    registered."""
    real = families.family_classes()
    if "cosyvoice2" not in real:
        monkeypatch.setattr(families, "family_classes",
                            lambda: {**real, "cosyvoice2": _CosyVoice2Presets})
    return families.family_classes()


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
