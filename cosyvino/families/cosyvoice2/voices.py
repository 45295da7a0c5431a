"""CosyVoice2 voices of ``spk2info.pt`` (sheet v2 §3.7): shared with CosyVoice3, defined in
:mod:`cosyvino.families.cosyvoice23.voices`; re-exported here under the v2 names. Must not import
torch."""

from __future__ import annotations

from cosyvino.families.cosyvoice23.voices import (
    VOICES_JSON,
    VOICES_NPZ,
    PromptVoice,
    read_voice_files,
    split_speakers,
    write_voice_files,
)

__all__ = ["VOICES_JSON", "VOICES_NPZ", "PromptVoice", "read_voice_files", "split_speakers",
           "write_voice_files"]
