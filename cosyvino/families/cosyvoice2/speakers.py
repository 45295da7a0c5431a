"""CosyVoice2 ``spk2info.pt`` (sheet v2 §3.7): the reader is shared with CosyVoice3 and lives in
:mod:`cosyvino.families.cosyvoice23.speakers`; these are its CosyVoice2 names. Must not import
torch.
"""

from __future__ import annotations

from cosyvino.families.cosyvoice23.speakers import (
    BUNDLE_KEYS,
    BUNDLE_TOKEN_KEYS,
    Speaker,
    ZeroShotBundle,
    load_spk2info,
)

#: one ``spk2info.pt`` entry (:class:`~cosyvino.families.cosyvoice23.speakers.Speaker`)
CosyVoice2Speaker = Speaker
#: :func:`~cosyvino.families.cosyvoice23.speakers.load_spk2info`
load_cosyvoice2_spk2info = load_spk2info

__all__ = ["BUNDLE_KEYS", "BUNDLE_TOKEN_KEYS", "CosyVoice2Speaker", "ZeroShotBundle",
           "load_cosyvoice2_spk2info"]
