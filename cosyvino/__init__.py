"""cosyvino: CosyVoice text-to-speech, fast on CPU servers.

Public API: :class:`Synthesizer`, :class:`Audio`, :class:`Voice`, :data:`hookimpl` (for
backend plugins) and the errors in :mod:`cosyvino.errors` (including the prompt-audio and
voice-store errors). Importing cosyvino does not import torch.
"""

from .hookspecs import hookimpl
from .version import __version__


def __getattr__(name):  # lazy: keep `import cosyvino` light for plugins and the CLI
    if name == "Synthesizer":
        from .synthesizer import Synthesizer
        return Synthesizer
    if name == "Audio":
        from .audio import Audio
        return Audio
    if name == "Voice":
        from .voices import Voice
        return Voice
    raise AttributeError(name)


__all__ = ["Synthesizer", "Audio", "Voice", "hookimpl", "__version__"]
