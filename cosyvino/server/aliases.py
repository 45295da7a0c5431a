"""OpenAI voice names -> the model's voices, for clients that only know OpenAI's names (the
OpenAI SDK's examples, Open WebUI's default ``alloy``). See docs/server.md, "Voice aliases".

An alias applies only to a name that is not one of the model's voices (a built-in speaker or a
registered voice named ``alloy`` is that voice). The default table maps each OpenAI voice to
an English built-in speaker of CosyVoice-300M-SFT / -Instruct by the voice's usual reading
(feminine -> ``英文女``, masculine -> ``英文男``; ``alloy``, described as neutral, -> ``英文女``);
a model without the target speaker maps it to its first speaker; a model with no built-in
speakers (CosyVoice-300M) has no default aliases. ``--voice-alias NAME=VOICE`` (or
``COSYVINO_VOICE_ALIASES``) adds or replaces entries; its targets are checked against the
model's voices when a request uses them (the usual 400 listing the voices).

The voice names are OpenAI's documented ``voice`` values of ``/v1/audio/speech``
(platform.openai.com/docs/guides/text-to-speech, as of 2026); the gender readings are this
project's choice, not OpenAI's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..errors import InputError

FEMALE_EN, MALE_EN = "英文女", "英文男"

#: OpenAI voice -> preferred built-in speaker (CosyVoice-300M-SFT's English speakers)
DEFAULT_ALIASES: dict[str, str] = {
    "alloy": FEMALE_EN, "ash": MALE_EN, "ballad": MALE_EN, "coral": FEMALE_EN,
    "echo": MALE_EN, "fable": MALE_EN, "onyx": MALE_EN, "nova": FEMALE_EN,
    "sage": FEMALE_EN, "shimmer": FEMALE_EN, "verse": MALE_EN,
    # the two voices OpenAI added with gpt-realtime / gpt-4o-mini-tts (2025)
    "marin": FEMALE_EN, "cedar": MALE_EN,
}


def parse_aliases(items: Iterable[str]) -> dict[str, str]:
    """``["alloy=中文女", "echo=bob"]`` -> ``{"alloy": "中文女", "echo": "bob"}`` (later items
    win). Raises InputError for an item without ``=`` or with an empty side."""
    out = {}
    for item in items:
        name, sep, voice = item.partition("=")
        name, voice = name.strip(), voice.strip()
        if not sep or not name or not voice:
            raise InputError(f"bad voice alias {item!r}: expected OPENAI_NAME=VOICE, e.g. "
                             "alloy=英文女")
        out[name] = voice
    return out


def resolve_aliases(speakers: Sequence[str], overrides: dict[str, str] | None = None
                    ) -> dict[str, str]:
    """The alias table of a model with built-in ``speakers``: :data:`DEFAULT_ALIASES` with
    each target replaced by the first speaker when the model lacks it (none at all when it
    has no speakers), then ``overrides`` on top."""
    table = {}
    if speakers:
        table = {name: voice if voice in speakers else speakers[0]
                 for name, voice in DEFAULT_ALIASES.items()}
    table.update(overrides or {})
    return table


def apply_alias(voice: str | None, voices: Iterable[str], table: dict[str, str]) -> str | None:
    """The voice to synthesize with: ``voice`` itself when it is one of ``voices`` (or
    None, or not in ``table``), else its alias."""
    if voice is None or voice not in table or voice in set(voices):
        return voice
    return table[voice]
