"""Synthetic stand-ins of the two ONNX prompt models of a CosyVoice v1 model dir, written with
random weights and exactly the official I/O contract (architecture sheet 3.4 / 3.5):

* ``campplus.onnx`` (speaker embedding): input ``feats`` float32 [1, T, 80] (mean-normalized
  Kaldi fbank), output ``embedding`` float32 [1, 192]. A CAM++-shaped network: a 2-D conv
  front end over the 80 bins (frequency strided by 8), a strided TDNN layer (time / 2), three
  densely connected TDNN blocks with context-aware masking gates and transition layers, mean+std
  statistics pooling and a 192-d projection (3D-Speaker's CAM++ layout: dense blocks of 12, 24
  and 16 layers, growth 32, bottleneck 128).
* ``speech_tokenizer_v1.onnx`` (speech tokens): inputs ``feats`` float32 [1, 128, T] (whisper
  log-mel) and ``feats_length`` int32 [1] (= T), output ``speech_tokens`` int64 [1, 1, T'],
  T' = ceil(T / 2), ids in 0..4095. A whisper-style encoder (conv k3 stride 1, conv k3 stride 2,
  GELU, sinusoidal positions up to 1500 frames = 30 s, pre-LN transformer blocks, final LN;
  keys past ``ceil(feats_length / 2)`` masked), then the L2-normalized features are matched
  to an L2-normalized codebook by the largest dot product (nearest neighbour). Full size: 6
  blocks, 1280-d, 20 heads, MLP 5120, 4096 codes (~130 M parameters, ~520 MB like the real
  523 MB file).

The CosyVoice2 stand-ins (:mod:`cosyvino.families.cosyvoice2.synthetic_prompt_models`) reuse
both builders: the same CAM++ network and the tokenizer with two stride-2 convs and an FSQ
quantizer (:class:`TokenizerShape`).

Tensor names are ours: the official code (and :mod:`.prompt_models`) feeds both models by
position (sheet 3.4 / 3.5, open question 6). Weights are random (std 1/sqrt(fan-in)); the
outputs carry no speaker or phonetic meaning, but the compute cost depends on the shapes only,
so benchmarks of the full-size stand-ins measure what the real files cost. Needs ``onnx``
(and numpy), not torch. Opset 17.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass

import numpy as np

from cosyvino.errors import InputError, ModelDirError
from cosyvino.fileutil import publish

CAMPPLUS_FILE = "campplus.onnx"
SPEECH_TOKENIZER_FILE = "speech_tokenizer_v1.onnx"
OPSET = 17
#: speech tokens of CosyVoice v1 (sheet 2: vocabulary 4096, ids 0..4095)
CODEBOOK_SIZE = 4096
#: 30 s of 100 Hz log-mel frames after the stride-2 conv: the tokenizer's position table
MAX_POSITIONS = 1500


@dataclass(frozen=True)
class CamPlusShape:
    """Shape of the CAM++-like stand-in. ``fcm_channels`` convs over (freq, time), the last
    ``fcm_strided`` of them stride 2 in frequency; ``blocks``: (layers, dilation) per dense
    block."""

    n_mels: int = 80
    fcm_channels: int = 32
    fcm_layers: int = 6
    fcm_strided: int = 3
    tdnn_channels: int = 128
    blocks: tuple[tuple[int, int], ...] = ((12, 1), (24, 2), (16, 2))
    growth: int = 32
    bottleneck: int = 128
    embedding_dim: int = 192


@dataclass(frozen=True)
class TokenizerShape:
    """Shape of the whisper-style speech-tokenizer stand-in.

    ``strides``: of the two k3 front-end convs (v1 ``(1, 2)``: 50 Hz tokens; v2 ``(2, 2)``:
    25 Hz). ``fsq_digits`` 0: nearest-neighbour ``codebook`` quantizer (v1, 4096 codes);
    ``fsq_digits`` n > 0: finite scalar quantization to n ternary digits, id = sum d_i 3^i
    (v2: 8 digits, 6561 codes; sheet v2 §3.4). ``output_name``: the token output's name."""

    n_mels: int = 128
    d_model: int = 1280
    heads: int = 20
    blocks: int = 6
    mlp: int = 5120
    codebook: int = CODEBOOK_SIZE
    strides: tuple[int, int] = (1, 2)
    fsq_digits: int = 0
    output_name: str = "speech_tokens"

    @property
    def vocab(self) -> int:
        """Token ids are 0 .. vocab - 1."""
        return 3 ** self.fsq_digits if self.fsq_digits else self.codebook


#: preset name -> (CAM++ shape, tokenizer shape); ``300m`` is the full size of the real files
PROMPT_PRESETS = {
    "tiny": (CamPlusShape(fcm_channels=4, fcm_layers=2, fcm_strided=2, tdnn_channels=16,
                          blocks=((2, 1),), growth=8, bottleneck=16),
             TokenizerShape(d_model=32, heads=2, blocks=1, mlp=64)),
    "300m": (CamPlusShape(), TokenizerShape()),
}


class _Graph:
    """Collects ONNX nodes and random initializers; names are generated."""

    def __init__(self, rng: np.random.Generator):
        from onnx import helper

        self.helper = helper
        self.rng = rng
        self.nodes: list = []
        self.inits: list = []
        self._n = 0

    def name(self, stem: str) -> str:
        self._n += 1
        return f"{stem}_{self._n}"

    def const(self, array: np.ndarray, stem: str = "c") -> str:
        from onnx import numpy_helper

        n = self.name(stem)
        array = np.asarray(array)  # (np.ascontiguousarray would turn a scalar into [1])
        self.inits.append(numpy_helper.from_array(np.array(array, order="C"), n))
        return n

    def weight(self, shape, fan_in: int, stem: str = "w") -> str:
        w = self.rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(1.0 / math.sqrt(fan_in))
        return self.const(w, stem)

    def op(self, op_type: str, inputs, n_out: int = 1, **attrs):
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(self.helper.make_node(op_type, list(inputs), outs, **attrs))
        return outs[0] if n_out == 1 else outs

    # ---- layers --------------------------------------------------------------------------
    def conv(self, x, c_in, c_out, kernel, *, stride=1, dilation=1, dims=1):
        k = (kernel,) * dims
        w = self.weight((c_out, c_in, *k), c_in * kernel ** dims)
        b = self.const(np.zeros(c_out, np.float32), "b")
        strides = list(stride) if isinstance(stride, tuple) else [stride] * dims
        pads = [dilation * (kernel - 1) // 2] * (2 * dims)
        return self.op("Conv", [x, w, b], kernel_shape=list(k), strides=strides,
                       dilations=[dilation] * dims, pads=pads)

    def linear(self, x, d_in, d_out, bias=True):
        y = self.op("MatMul", [x, self.weight((d_in, d_out), d_in)])
        return self.op("Add", [y, self.const(np.zeros(d_out, np.float32), "b")]) if bias else y

    def layer_norm(self, x, d):
        return self.op("LayerNormalization", [x, self.const(np.ones(d, np.float32), "g"),
                                              self.const(np.zeros(d, np.float32), "b")],
                       axis=-1, epsilon=1e-5)

    def gelu(self, x):  # exact GELU: 0.5 x (1 + erf(x / sqrt 2)) (Gelu is opset 20)
        e = self.op("Erf", [self.op("Div", [x, self.const(np.float32(math.sqrt(2.0)))])])
        return self.op("Mul", [self.op("Mul", [x, self.const(np.float32(0.5))]),
                               self.op("Add", [e, self.const(np.float32(1.0))])])

    def model(self, inputs, outputs, doc: str):
        from onnx import helper

        graph = helper.make_graph(self.nodes, "cosyvino_synthetic", inputs, outputs,
                                  initializer=self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="cosyvino make-model", doc_string=doc)
        m.ir_version = 8  # readable by every onnxruntime / OpenVINO of the last years
        return m


def campplus_model(shape: CamPlusShape, seed: int = 0):
    """The CAM++-like stand-in as an ``onnx.ModelProto`` (module docstring)."""
    from onnx import TensorProto, helper

    g = _Graph(np.random.default_rng(seed))
    x = g.op("Transpose", ["feats"], perm=[0, 2, 1])                    # [1, 80, T]
    x = g.op("Unsqueeze", [x, g.const(np.array([1], np.int64))])        # [1, 1, 80, T]
    c_in, freq = 1, shape.n_mels
    for i in range(shape.fcm_layers):
        strided = i >= shape.fcm_layers - shape.fcm_strided
        x = g.op("Relu", [g.conv(x, c_in, shape.fcm_channels, 3, dims=2,
                                 stride=(2, 1) if strided else 1)])
        c_in = shape.fcm_channels
        freq = (freq + 1) // 2 if strided else freq
    chans = shape.fcm_channels * freq
    x = g.op("Reshape", [x, g.const(np.array([0, chans, -1], np.int64))])  # [1, C*F, T]
    x = g.op("Relu", [g.conv(x, chans, shape.tdnn_channels, 5, stride=2)])  # time / 2
    chans = shape.tdnn_channels
    for layers, dilation in shape.blocks:
        for _ in range(layers):
            h = g.op("Relu", [g.conv(x, chans, shape.bottleneck, 1)])
            local = g.conv(h, shape.bottleneck, shape.growth, 3, dilation=dilation)
            ctx = g.op("ReduceMean", [h], axes=[2], keepdims=1)         # context-aware mask
            ctx = g.op("Relu", [g.conv(ctx, shape.bottleneck, shape.bottleneck // 2, 1)])
            gate = g.op("Sigmoid", [g.conv(ctx, shape.bottleneck // 2, shape.growth, 1)])
            x = g.op("Concat", [x, g.op("Relu", [g.op("Mul", [local, gate])])], axis=1)
            chans += shape.growth
        x = g.op("Relu", [g.conv(x, chans, chans // 2, 1)])             # transition layer
        chans //= 2
    mean = g.op("ReduceMean", [x], axes=[2], keepdims=1)
    dev = g.op("Sub", [x, mean])
    var = g.op("ReduceMean", [g.op("Mul", [dev, dev])], axes=[2], keepdims=1)
    std = g.op("Sqrt", [g.op("Add", [var, g.const(np.float32(1e-5))])])
    stats = g.op("Concat", [mean, std], axis=1)                         # [1, 2C, 1]
    emb = g.conv(stats, 2 * chans, shape.embedding_dim, 1)
    emb = g.op("Flatten", [emb], axis=1)
    g.nodes[-1].output[0] = "embedding"
    return g.model(
        [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, "T", shape.n_mels])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT,
                                       [1, shape.embedding_dim])],
        "SYNTHETIC CAM++-like speaker embedding (random weights): feats [1,T,80] -> [1,192]")


def _sinusoids(length: int, dim: int) -> np.ndarray:
    """Whisper's sinusoidal position table [length, dim] (sin half, cos half)."""
    inc = math.log(10000) / (dim // 2 - 1)
    inv = np.exp(-inc * np.arange(dim // 2))
    t = np.arange(length)[:, None] * inv[None, :]
    return np.concatenate([np.sin(t), np.cos(t)], axis=1).astype(np.float32)


def tokenizer_model(shape: TokenizerShape, seed: int = 0):
    """The whisper-style speech-tokenizer stand-in as an ``onnx.ModelProto`` (module
    docstring)."""
    from onnx import TensorProto, helper

    if shape.d_model % shape.heads:
        raise InputError(f"d_model {shape.d_model} is not a multiple of heads {shape.heads}")
    g = _Graph(np.random.default_rng(seed))
    d, heads = shape.d_model, shape.heads
    dh = d // heads
    x = g.gelu(g.conv("feats", shape.n_mels, d, 3, stride=shape.strides[0]))
    x = g.gelu(g.conv(x, d, d, 3, stride=shape.strides[1]))             # [1, d, T']
    x = g.op("Transpose", [x], perm=[0, 2, 1])                          # [1, T', d]
    t_out = g.op("Gather", [g.op("Shape", [x]), g.const(np.array(1, np.int64))], axis=0)
    zero, one = g.const(np.array(0, np.int64)), g.const(np.array(1, np.int64))
    pos = g.op("Slice", [g.const(_sinusoids(MAX_POSITIONS, d), "pos"),
                         g.op("Unsqueeze", [zero, g.const(np.array([0], np.int64))]),
                         g.op("Unsqueeze", [t_out, g.const(np.array([0], np.int64))])])
    x = g.op("Add", [x, pos])
    # key mask: frames at or past the valid length (feats_length through the strided convs,
    # ceil(len / stride) per stride-2 conv) get -1e9
    valid_len = g.op("Cast", ["feats_length"], to=TensorProto.INT64)
    for stride in shape.strides:
        if stride > 1:
            valid_len = g.op("Div", [g.op("Add", [valid_len, g.const(np.array(
                stride - 1, np.int64))]), g.const(np.array(stride, np.int64))])
    valid = g.op("Less", [g.op("Range", [zero, t_out, one]), valid_len])
    bias = g.op("Where", [valid, g.const(np.float32(0.0)), g.const(np.float32(-1e9))])
    bias = g.op("Reshape", [bias, g.const(np.array([1, 1, 1, -1], np.int64))])
    split = g.const(np.array([0, -1, heads, dh], np.int64))
    for _ in range(shape.blocks):
        h = g.layer_norm(x, d)
        q, k, v = (g.op("Transpose", [g.op("Reshape", [g.linear(h, d, d, bias=b), split])],
                        perm=p)
                   for b, p in ((True, [0, 2, 1, 3]), (False, [0, 2, 3, 1]),
                                (True, [0, 2, 1, 3])))
        scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k]),
                                           g.const(np.float32(1.0 / math.sqrt(dh)))]), bias])
        att = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])      # [1, H, T', dh]
        att = g.op("Reshape", [g.op("Transpose", [att], perm=[0, 2, 1, 3]),
                               g.const(np.array([0, -1, d], np.int64))])
        x = g.op("Add", [x, g.linear(att, d, d)])
        h = g.gelu(g.linear(g.layer_norm(x, d), d, shape.mlp))
        x = g.op("Add", [x, g.linear(h, shape.mlp, d)])
    x = g.layer_norm(x, d)
    ids = _fsq(g, x, d, shape.fsq_digits) if shape.fsq_digits else _nearest_code(g, x, d,
                                                                                  shape.codebook)
    g.op("Unsqueeze", [ids, g.const(np.array([1], np.int64))])
    g.nodes[-1].output[0] = shape.output_name
    rate = "ceil(T/2)" if shape.strides == (1, 2) else "ceil(ceil(T/2)/2)"
    return g.model(
        [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, shape.n_mels, "T"]),
         helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1])],
        [helper.make_tensor_value_info(shape.output_name, TensorProto.INT64, [1, 1, "T_out"])],
        "SYNTHETIC whisper-style S3 speech tokenizer (random weights): feats [1,128,T], "
        f"feats_length [1] -> {shape.output_name} [1,1,{rate}], ids 0..{shape.vocab - 1}")


def _nearest_code(g: _Graph, x: str, d: int, codebook_size: int) -> str:
    """ids int64 [1, T'] of the L2-normalized features' nearest L2-normalized code (v1)."""
    x = g.op("Div", [x, g.op("ReduceL2", [x], axes=[-1], keepdims=1)])
    codebook = g.rng.standard_normal((codebook_size, d), dtype=np.float32)
    codebook /= np.linalg.norm(codebook, axis=1, keepdims=True)
    sim = g.op("MatMul", [x, g.const(codebook.T, "codebook")])
    return g.op("ArgMax", [sim], axis=-1, keepdims=0)                  # [1, T'] int64


def _fsq(g: _Graph, x: str, d: int, digits: int) -> str:
    """ids int64 [1, T'] by finite scalar quantization (v2, sheet v2 §3.4): Linear(d -> digits),
    tanh, x 0.999, round, + 1 -> ternary digits d_i, id = sum d_i 3^i."""
    from onnx import TensorProto

    h = g.op("Tanh", [g.linear(x, d, digits)])
    h = g.op("Add", [g.op("Round", [g.op("Mul", [h, g.const(np.float32(0.999))])]),
                     g.const(np.float32(1.0))])                          # [1, T', digits]
    powers = (3.0 ** np.arange(digits)).astype(np.float32)[:, None]     # [digits, 1]
    ids = g.op("MatMul", [h, g.const(powers, "powers")])                 # [1, T', 1], exact
    ids = g.op("Squeeze", [ids, g.const(np.array([-1], np.int64))])
    return g.op("Cast", [ids], to=TensorProto.INT64)


def _save(model, path: str) -> None:
    import onnx

    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.tmp-",
                               dir=os.path.dirname(path) or ".")
    os.close(fd)
    try:
        onnx.save(model, tmp)
        publish(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_prompt_models(out_dir: str | os.PathLike, preset: str = "tiny", *,
                        seed: int = 0) -> tuple[str, str]:
    """Write ``campplus.onnx`` and ``speech_tokenizer_v1.onnx`` stand-ins into ``out_dir``.

    Args:
        out_dir: an existing directory (a model dir); each file is written atomically.
        preset: ``"tiny"`` (tests: a few thousand parameters plus the 4096-entry codebook) or
            ``"300m"`` (full size; see :data:`PROMPT_PRESETS`).
        seed: seed of the random weights (the tokenizer uses ``seed + 1``).

    Returns:
        (campplus path, speech tokenizer path).

    Raises:
        InputError: unknown preset.
        ModelDirError: ``onnx`` is not installed, or ``out_dir`` cannot be written.
    """
    if preset not in PROMPT_PRESETS:
        raise InputError(f"unknown prompt-model preset {preset!r}; choose one of "
                         f"{', '.join(PROMPT_PRESETS)}")
    cam, tok = PROMPT_PRESETS[preset]
    return write_prompt_model_files(out_dir, cam, tok, SPEECH_TOKENIZER_FILE, seed=seed)


def write_prompt_model_files(out_dir: str | os.PathLike, cam: CamPlusShape,
                             tok: TokenizerShape, tokenizer_file: str, *,
                             seed: int = 0) -> tuple[str, str]:
    """Write the CAM++ stand-in of shape ``cam`` as ``campplus.onnx`` and the tokenizer
    stand-in of shape ``tok`` as ``tokenizer_file`` into ``out_dir`` (each atomically; the
    tokenizer's weights use ``seed + 1``). Returns both paths.

    Raises:
        ModelDirError: ``onnx`` is not installed, or ``out_dir`` cannot be written.
    """
    try:
        import onnx  # noqa: F401
    except ImportError as e:
        raise ModelDirError(f"writing the synthetic prompt models needs onnx ({e}); "
                            "pip install 'cosyvino[onnxruntime]'") from None
    out_dir = os.fspath(out_dir)
    paths = (os.path.join(out_dir, CAMPPLUS_FILE), os.path.join(out_dir, tokenizer_file))
    try:
        _save(campplus_model(cam, seed), paths[0])
        _save(tokenizer_model(tok, seed + 1), paths[1])
    except OSError as e:
        raise ModelDirError(f"cannot write the prompt models into {out_dir}: {e}",
                            out_dir) from None
    return paths
