"""The CosyVoice2 family (CosyVoice2-0.5B): config, torch model, modes, streaming policy and graph
table. What it shares with CosyVoice3 (the Qwen2 speech LM on ``inputs_embeds``, the causal flow
pieces, the Qwen tokenizer) lives once in :mod:`cosyvino.families.cosyvoice23`.
Facts: the CosyVoice2 architecture sheet (section numbers cited in each module)."""
