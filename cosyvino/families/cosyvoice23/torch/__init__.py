"""Torch modules shared by CosyVoice2 and CosyVoice3."""
