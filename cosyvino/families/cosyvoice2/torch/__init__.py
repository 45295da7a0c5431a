"""CosyVoice2's torch modules (reference implementation; the exporters trace them)."""
