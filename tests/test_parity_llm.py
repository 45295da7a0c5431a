"""Parity of our LLM and flow encoder with the official implementation's golden tensors.

Runs for ``cosyvino/testing/fixtures/tiny-a`` and for every directory in ``COSYVINO_GOLDEN_DIRS``
(colon-separated, same layout: ``cosyvoice.yaml``, ``llm.pt``, ``flow.pt``, ``golden.pt``).
Golden tensors must be reproduced to max abs 1e-4 (fp32). Also checks that the KV-cached LLM
step is consistent with itself (prefill == token by token) and that it exports with dynamic
sizes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cosyvino.families.cosyvoice1.torch.flow import Flow
from cosyvino.families.cosyvoice1.torch.flow_encoder import FlowEncoderStage
from cosyvino.families.cosyvoice1.torch.llm import (
    LLMStepStage,
    SpeakerEmbedStage,
    SpeechEmbedStage,
    TextEncoderStage,
    TransformerLM,
)

TOL = 1e-4
SELF_TOL = 1e-5
FIXTURES = Path(__file__).parent / "fixtures"


from conftest import TINY_A, golden_dirs as _golden_dirs  # noqa: E402


def _model_config(model_dir: Path):
    from cosyvino.families.cosyvoice1.yaml_config import read_model_config

    return read_model_config(model_dir / "cosyvoice.yaml")


class Loaded:
    """One golden directory: config, strictly loaded modules and the golden tensors."""

    def __init__(self, model_dir: Path):
        self.dir = model_dir
        cfg = _model_config(model_dir)
        self.llm_sd = torch.load(model_dir / "llm.pt", map_location="cpu", weights_only=True)
        self.flow_sd = torch.load(model_dir / "flow.pt", map_location="cpu", weights_only=True)
        self.lm = TransformerLM(cfg.llm).eval()
        self.lm.load_state_dict(self.llm_sd, strict=True)
        self.flow = Flow(cfg.flow).eval()
        self.flow.load_state_dict(self.flow_sd, strict=True)
        golden = torch.load(model_dir / "golden.pt", map_location="cpu", weights_only=False)
        self.g_llm, self.g_flow = golden["llm"], golden["flow"]

    def lm_input(self, text_token, embedding, prompt_speech_token=None):
        """[sos, spk, text_enc, task(, prompt speech)] -> [1, T, D]."""
        sos, task = self.lm.special_embeddings()
        parts = [sos, SpeakerEmbedStage(self.lm)(embedding),
                 TextEncoderStage(self.lm)(text_token.long()), task]
        if prompt_speech_token is not None:
            parts.append(SpeechEmbedStage(self.lm)(prompt_speech_token.long()))
        return torch.cat(parts, dim=1)


@pytest.fixture(scope="module", params=_golden_dirs(), ids=lambda p: p.name)
def loaded(request) -> Loaded:
    if not (request.param / "golden.pt").is_file():
        pytest.fail(f"golden dir {request.param} has no golden.pt (from COSYVINO_GOLDEN_DIRS?)")
    torch.manual_seed(0)
    with torch.no_grad():
        return Loaded(request.param)


def _maxabs(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.float() - b.float()).abs().max().item()


def test_state_dict_key_order(loaded):
    assert list(loaded.lm.state_dict()) == list(loaded.llm_sd)
    assert list(loaded.flow.state_dict()) == list(loaded.flow_sd)


@torch.no_grad()
def test_text_encoder_and_lm_input(loaded):
    g = loaded.g_llm
    te = TextEncoderStage(loaded.lm)(g["text_token"].long())
    assert te.dtype == torch.float32
    assert _maxabs(te, g["text_encoder_out"]) < TOL
    assert _maxabs(loaded.lm_input(g["text_token"], g["embedding"]), g["lm_input"]) < TOL


@pytest.mark.parametrize("query_side_pos", [True, False])
@torch.no_grad()
def test_teacher_forced_logp(loaded, query_side_pos):
    g = loaded.g_llm
    step = LLMStepStage(loaded.lm, query_side_pos)
    embed = SpeechEmbedStage(loaded.lm)
    past_k, past_v = step.empty_cache()
    logp, past_k, past_v = step(loaded.lm_input(g["text_token"], g["embedding"]), past_k, past_v)
    rows = [logp]
    for tok in g["forced_speech_tokens"]:
        logp, past_k, past_v = step(embed(tok.reshape(1, 1)), past_k, past_v)
        rows.append(logp)
    got = torch.cat(rows)
    assert got.shape == g["logp"].shape
    assert _maxabs(got, g["logp"]) < TOL
    assert past_k.shape[3] == g["lm_input"].shape[1] + len(g["forced_speech_tokens"])
    assert past_v.shape == past_k.shape


@torch.no_grad()
def test_zero_shot(loaded):
    g = loaded.g_llm
    text = torch.cat([g["prompt_text_token"], g["text_token"]], dim=1)
    x = loaded.lm_input(text, g["embedding"], g["prompt_speech_token"])
    assert _maxabs(x, g["zero_shot_lm_input"]) < TOL
    step = LLMStepStage(loaded.lm)
    logp, _, _ = step(x, *step.empty_cache())
    assert _maxabs(logp[0], g["zero_shot_first_logp"]) < TOL


@torch.no_grad()
def test_flow_encoder(loaded):
    g = loaded.g_flow
    h, spks = FlowEncoderStage(loaded.flow)(g["speech_token"], g["embedding"])
    assert _maxabs(spks, g["spk_proj"]) < TOL
    assert _maxabs(h, g["encoder_proj_out"]) < TOL


@torch.no_grad()
def test_prefill_equals_incremental(loaded):
    """Full causal forward == one prefill == token-by-token == uneven chunks (both pos modes)."""
    g = loaded.g_llm
    lm = loaded.lm
    x = torch.cat([loaded.lm_input(g["text_token"], g["embedding"]),
                   SpeechEmbedStage(lm)(g["forced_speech_tokens"].reshape(1, -1))], dim=1)
    total = x.shape[1]
    full = torch.log_softmax(lm.llm_decoder(lm.llm(x)), dim=-1)[0]  # [total, V], no cache

    for query_side_pos in (True, False):
        step = LLMStepStage(lm, query_side_pos)
        logp, k_pre, v_pre = step(x, *step.empty_cache())
        assert _maxabs(logp[0], full[-1]) < SELF_TOL

        past_k, past_v = step.empty_cache()
        for i in range(total):
            logp, past_k, past_v = step(x[:, i:i + 1], past_k, past_v)
            assert _maxabs(logp[0], full[i]) < SELF_TOL, i
        assert _maxabs(past_k, k_pre) < SELF_TOL
        assert _maxabs(past_v, v_pre) < SELF_TOL

        past_k, past_v = step.empty_cache()
        start = 0
        for size in (5, 1, 7, 3, total):
            end = min(start + size, total)
            if end == start:
                break
            logp, past_k, past_v = step(x[:, start:end], past_k, past_v)
            assert _maxabs(logp[0], full[end - 1]) < SELF_TOL, (start, end)
            start = end


@torch.no_grad()
def test_llm_step_exports_with_dynamic_sizes():
    """torch.export of LLMStepStage with dynamic T and P; run the program at P = 0 and P > 0."""
    loaded_lm = TransformerLM(_model_config(TINY_A).llm).eval()
    step = LLMStepStage(loaded_lm)
    enc = loaded_lm.llm
    layers, heads, dk, d = len(enc.encoders), enc.num_heads, enc.head_dim, enc.cfg.output_size

    def args(t, p):
        return (torch.randn(1, t, d), torch.randn(layers, 1, heads, p, dk),
                torch.randn(layers, 1, heads, p, dk))

    dim_t = torch.export.Dim("T", min=1, max=4096)
    dim_p = torch.export.Dim("P", min=0, max=8192)
    program = torch.export.export(step, args(3, 5),
                                  dynamic_shapes=({1: dim_t}, {3: dim_p}, {3: dim_p}))
    module = program.module()
    for t, p in [(1, 0), (6, 0), (1, 9), (4, 11)]:
        a = args(t, p)
        ref = step(*a)
        got = module(*a)
        assert got[1].shape == (layers, 1, heads, p + t, dk)
        for r, o in zip(ref, got):
            assert _maxabs(o, r) < 1e-6


@torch.no_grad()
def test_bucketed_position_table_gives_the_same_steps(loaded):
    """forward_cached with pos_bucket > 1 (a longer position table, sliced in the attention)
    equals the exact table for prefill and for decode steps across bucket boundaries."""
    g = loaded.g_llm
    lm = loaded.lm
    x = torch.cat([loaded.lm_input(g["text_token"], g["embedding"]),
                   SpeechEmbedStage(lm)(g["forced_speech_tokens"].reshape(1, -1))], dim=1)
    enc = lm.llm
    for query_side_pos in (True, False):
        runs = []
        for bucket in (1, 4):
            ks, vs = enc.empty_cache()
            outs = []
            for start, end in ((0, 6), (6, 7), (7, 8), (8, 11), (11, x.shape[1])):
                h, ks, vs = enc.forward_cached(x[:, start:end], ks, vs, query_side_pos, bucket)
                outs.append(h)
            runs.append(torch.cat(outs, dim=1))
        assert runs[0].shape == runs[1].shape == (1, x.shape[1], enc.cfg.output_size)
        assert _maxabs(runs[0], runs[1]) < 1e-5, query_side_pos


@torch.no_grad()
@pytest.mark.parametrize("t", [1, 5])
def test_exported_query_pos_projection_is_the_per_head_product(loaded, t):
    """The OpenVINO exporter's block-diagonal form of ``q_v_h @ W_pos_h`` (a 2-D weight, so the
    CPU plugin runs it as a FullyConnected) equals the per-head product of the 3-D weight."""
    from cosyvino.export.openvino.model_patcher import _query_pos_projection

    att = loaded.lm.llm.encoders[0].self_attn
    torch.manual_seed(t)
    q_v = torch.randn(1, att.h, t, att.d_k)
    want = torch.matmul(q_v, att.linear_pos.weight.reshape(att.h, att.d_k, -1))
    got = _query_pos_projection(att, q_v)
    assert got.shape == want.shape == (1, att.h, t, att.h * att.d_k)
    assert _maxabs(got, want) < 1e-5
    # a head's rows must come from its own slice of W_pos: swapping two heads' queries moves
    # their results (a block-structure mistake would not)
    swapped = _query_pos_projection(att, q_v[:, [1, 0, *range(2, att.h)]])
    assert _maxabs(swapped[:, 0], want[:, 0]) > 1e-3
