"""What the CosyVoice2 and CosyVoice3 families share: the Qwen2 speech language model on
``inputs_embeds`` with its own KV cache, the Qwen2 text tokenizer of ``CosyVoice-BlankEN/``, the
causal flow building blocks. Imports nothing from either family."""
