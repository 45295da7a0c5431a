"""Model directory handling (config parsing, strict checkpoint loading, presets).

Nothing here imports torch at module import time; the PyTorch implementation of the
architecture lives in :mod:`cosyvino.models.torch` and is imported only by code that needs it.
"""
