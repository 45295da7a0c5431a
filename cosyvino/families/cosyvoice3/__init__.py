"""The CosyVoice3 family (Fun-CosyVoice3-0.5B-2512): config, torch model, streaming policy. What it
shares with CosyVoice2 (the Qwen2 speech LM on ``inputs_embeds``, the causal flow pieces, the Qwen
tokenizer) lives once in :mod:`cosyvino.families.cosyvoice23`.
Facts: the CosyVoice3 architecture sheet (section numbers cited in each module)."""
