"""CosyVoice3's torch modules (reference implementation; the exporters trace them)."""
