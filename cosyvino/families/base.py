"""What a model family is: the interface every family (CosyVoice v1 built in; v2/v3 or a third
party's next) implements, and the types of its graph table. Must not import torch.

Vocabulary (used the same way in code and docs, see docs/architecture.md):

* **graph**: one exported computation with fixed tensor inputs/outputs (``text_encoder``,
  ``llm``, ``estimator``...): one IR / ONNX file, one entry of the family's
  :class:`GraphTable`, one name in timings' ``graph`` column.
* **component**: the model part a graph belongs to (``llm``, ``flow``, ``vocoder``): the unit
  of precision choices (quantization presets, ``stage_precision`` groups).
* **stages**: the family's calls its orchestration makes on a loaded model
  (:class:`cosyvino.backends.Stages` subclass of the family, e.g.
  :class:`cosyvino.families.cosyvoice1.stages.CosyVoice1Stages`); a backend implements them
  directly or gets them from the family over a :class:`cosyvino.backends.graphs.GraphRunner`.
* **phase**: a step kind of one request in the engine (prefill, decode, flow, vocoder).
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Mapping

import numpy as np

#: dtypes a graph tensor may have (numpy names)
DTYPES = ("float32", "int64", "int32")

#: the roles a graph may play in its model (:attr:`GraphSpec.role`): what the layers above the
#: families (quantizer, planner, bench) key on instead of a family's graph names. The names are
#: those of the CosyVoice v1 graphs that play them (every CosyVoice family has these parts;
#: v1's graph names predate the roles and stay as they are).
ROLES = {
    "text_encoder": "text ids -> LLM input rows (v1: the text conformer; v2/v3: the Qwen2 "
                    "token embedding)",
    "speech_embedding": "speech tokens -> LLM input rows (the decode step's input)",
    "llm_embedding": "the LLM's special rows (SOS, TASK ...)",
    "llm": "the KV-cached speech-LM step (prefill and decode), stateful",
    "flow_encoder": "speech tokens (+ speaker) -> the flow's conditioning",
    "length_regulator": "token-rate features -> mel-rate features",
    "estimator": "the CFM velocity estimator (one call per Euler step, batch 2 for CFG)",
    "hift_f0": "the vocoder's f0 predictor (mel -> f0)",
    "hift_source": "the vocoder's NSF harmonic source (f0 + noise -> source)",
    "hift_decode": "the vocoder's decoder (mel + source -> waveform)",
}


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output.

    Attributes:
        name: tensor name in the exported file (IR port name, ONNX input/output name).
        dtype: numpy dtype name, one of :data:`DTYPES`.
        shape: per dimension an ``int`` (fixed) or a ``str`` (a named dynamic dim; the same
            name in several tensors of one graph means the same length).
    """

    name: str
    dtype: str
    shape: tuple[int | str, ...]

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"TensorSpec {self.name!r}: dtype must be one of {DTYPES}, got "
                             f"{self.dtype!r}")

    @property
    def dynamic_axes(self) -> dict[int, str]:
        """axis -> dim name for the dynamic dims (``torch.onnx.export`` ``dynamic_axes``)."""
        return {i: d for i, d in enumerate(self.shape) if isinstance(d, str)}

    @property
    def partial_shape(self) -> list[int]:
        """The shape with -1 for dynamic dims (OpenVINO ``PartialShape``)."""
        return [d if isinstance(d, int) else -1 for d in self.shape]

    def example(self, sizes: Mapping[str, int], rng: np.random.Generator,
                high: int = 100) -> np.ndarray:
        """A random array of this spec with dynamic dims from ``sizes`` (ints in [0, high))."""
        shape = tuple(d if isinstance(d, int) else int(sizes[d]) for d in self.shape)
        if self.dtype == "float32":
            return rng.standard_normal(shape).astype(np.float32)
        return rng.integers(0, high, size=shape).astype(self.dtype)


@dataclass(frozen=True)
class StateSpec:
    """A state carried from one call of a stateful graph to the next (a KV cache tensor).

    The graph takes ``input`` (the state so far) and returns ``output`` (the state after the
    call, grown along ``axis``); a runtime either keeps it inside the compiled graph (OpenVINO
    stateful models: ReadValue/Assign) or feeds ``output`` back as the next ``input``. The
    state starts empty: shape ``init_shape`` with 0 along ``axis``.
    """

    input: str
    output: str
    init_shape: tuple[int, ...]
    axis: int = 2
    dtype: str = "float32"

    def initial(self) -> np.ndarray:
        return np.zeros(self.init_shape, dtype=self.dtype)


@dataclass(frozen=True)
class GraphSpec:
    """One exported graph of a family: everything exporters, graph-running backends, the
    quantizer's capture and the conformance suite need to know about it.

    Attributes:
        name: graph name (``text_encoder``, ``llm``...); unique in the table.
        component: model part (``llm``, ``flow``, ``vocoder``): precision/quantization unit.
        inputs / outputs: the tensors, in call order. For a stateful graph they include the
            state tensors (``state``), after the data tensors.
        state: carried state (empty for pure graphs).
        example_sizes: dynamic dim -> size for export examples and conformance calls; sizes
            are deliberately unlike each other so a size baked into a graph shows in parity
            tests.
        torch_module: ``f(torch_model) -> nn.Module`` whose ``forward`` takes the inputs in
            order and returns the outputs (a tuple when several) — what the exporters trace and
            the generic torch runner calls. None: the family exports this graph itself.
        file_stem: file name stem of the exported graph (default: ``name``).
        doc: one line for docs and errors.
        role: what the graph does in the model, a key of :data:`ROLES` ("" = none the layers
            above the families know): the quantizer's recipes, capture and report key on it.
    """

    name: str
    component: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    state: tuple[StateSpec, ...] = ()
    example_sizes: Mapping[str, int] = field(default_factory=dict)
    torch_module: Callable[[Any], Any] | None = None
    file_stem: str = ""
    doc: str = ""
    role: str = ""

    def __post_init__(self):
        if self.role and self.role not in ROLES:
            raise ValueError(f"graph {self.name!r}: role must be one of {sorted(ROLES)} or "
                             f"empty, got {self.role!r}")

    @property
    def stem(self) -> str:
        return self.file_stem or self.name

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    @property
    def data_inputs(self) -> tuple[TensorSpec, ...]:
        """Inputs that are not state (what a caller of a stateful graph passes)."""
        carried = {s.input for s in self.state}
        return tuple(t for t in self.inputs if t.name not in carried)

    @property
    def data_outputs(self) -> tuple[TensorSpec, ...]:
        carried = {s.output for s in self.state}
        return tuple(t for t in self.outputs if t.name not in carried)

    @property
    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        """``torch.onnx.export`` ``dynamic_axes`` for every tensor with a dynamic dim."""
        return {t.name: t.dynamic_axes for t in (*self.inputs, *self.outputs)
                if t.dynamic_axes}

    def example_inputs(self, seed: int = 0, high: int = 100) -> list[np.ndarray]:
        """Random inputs of this graph at :attr:`example_sizes` (int inputs in [0, high))."""
        rng = np.random.default_rng(seed)
        return [t.example(self.example_sizes, rng, high) for t in self.inputs]


class GraphTable(Mapping[str, GraphSpec]):
    """The ordered table of a family's exported graphs (name -> :class:`GraphSpec`)."""

    def __init__(self, graphs: list[GraphSpec] | tuple[GraphSpec, ...]):
        self._graphs = {g.name: g for g in graphs}
        if len(self._graphs) != len(graphs):
            raise ValueError("graph names must be unique")

    def __getitem__(self, name: str) -> GraphSpec:
        return self._graphs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._graphs)

    def __len__(self) -> int:
        return len(self._graphs)

    @property
    def stems(self) -> dict[str, str]:
        """graph name -> file stem."""
        return {g.name: g.stem for g in self._graphs.values()}

    def component(self, name: str) -> list[str]:
        """Graph names of one component, in table order."""
        return [g.name for g in self._graphs.values() if g.component == name]

    def with_role(self, role: str) -> list[str]:
        """Graph names playing ``role`` (a key of :data:`ROLES`), in table order ([] when
        the family has no such graph)."""
        return [g.name for g in self._graphs.values() if g.role == role]

    @property
    def roles(self) -> dict[str, str]:
        """graph name -> role, for the graphs that declare one."""
        return {g.name: g.role for g in self._graphs.values() if g.role}

    @property
    def components(self) -> list[str]:
        seen: list[str] = []
        for g in self._graphs.values():
            if g.component not in seen:
                seen.append(g.component)
        return seen


@dataclass(frozen=True)
class Mode:
    """A synthesis mode of a family (``sft``, ``zero_shot``, ``instruct``...): what a request in
    this mode needs. The family's program builds the LLM prefix and flow conditioning for it.
    ``SynthesisRequest.validated`` checks a request against these flags (a needed input must be
    there, an input the mode does not take must not be given) and, for a request that names no
    mode, picks the first of the model's modes whose flags the request fits.

    Attributes:
        name: the mode name requests use.
        doc: one line.
        needs_speaker: a voice (``voice``: a built-in speaker or any registered voice) is
            required.
        needs_prompt_audio: a prompt recording is required: ``prompt_audio`` (processed into a
            prompt bundle once per request), or instead a ``voice`` that is a prompt bundle (a
            registered voice); built-in speakers do not qualify.
        needs_prompt_text: the prompt recording's transcript is required: ``prompt_text``, or
            the text stored with a registered voice.
        needs_instruction: an instruction text is required.
        needs_source_audio: a source recording (``source_audio``; voice conversion) is
            required; its speech tokens replace the text (which must then be empty).
    """

    name: str
    doc: str = ""
    needs_speaker: bool = True
    needs_prompt_audio: bool = False
    needs_prompt_text: bool = False
    needs_instruction: bool = False
    needs_source_audio: bool = False


@dataclass(frozen=True)
class DecodeProfile:
    """Per-token work of a family's LLM decode step, from its config (no weights read).

    Attributes:
        params: weights one step multiplies with (decoder blocks + output head), count.
        kv_bytes_per_position: bytes of K and V cache one cached position holds, all layers,
            at the cache's dtype (fp32 caches: ``2 * layers * d_model * 4``).
        typical_positions: cached positions of a typical request mid-decode (prompt +
            speech tokens so far), used to price a row's cache reads.
    """

    params: int
    kv_bytes_per_position: int
    typical_positions: int


class ModelFamily(abc.ABC):
    """A model family: registered through the ``register_families`` hook
    (:mod:`cosyvino.hookspecs`), looked up with :func:`cosyvino.families.detect_family` /
    :func:`cosyvino.families.get_family`.

    A family owns its config reading, synthetic presets, torch model, graph table, modes and
    streaming policy, and the per-request program the engine drives. Class attributes:
    ``name`` (recorded in converted manifests), ``description``. Methods must not import torch
    unless they say so.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: files a converted dir copies from the source dir (configs the runtime reads)
    config_files: ClassVar[tuple[str, ...]] = ()
    #: the checkpoint's prompt models (already ONNX, read by every runtime) that a converted
    #: dir carries as they are, when the source dir has them (v1: ``campplus.onnx``,
    #: ``speech_tokenizer_v1.onnx``); what :meth:`prompt_encoder` loads from a converted dir
    prompt_model_files: ClassVar[tuple[str, ...]] = ()
    #: official checkpoints of the family on the model hubs: checkpoint name -> {hub:
    #: repository id} (hubs: ``huggingface``, ``modelscope``), what ``cosyvino download NAME``
    #: fetches; the ids of the upstream README's download section
    download_ids: ClassVar[Mapping[str, Mapping[str, str]]] = {}
    #: the lanes of the family's programs (:attr:`cosyvino.engine.program.Program.lanes`):
    #: steps of different lanes of one request may run at the same time on thread-safe stages
    #: whether the family's programs take text while they run (``SynthesisRequest
    #: .text_stream``, :meth:`cosyvino.Synthesizer.open_text_stream`; CosyVoice2/3's bistream)
    text_in: ClassVar[bool] = False
    lanes: ClassVar[tuple[str, ...]] = ("main",)
    #: ``cosyvino quantize`` takes this family's OpenVINO conversions: its graph table declares
    #: the roles (:data:`ROLES`) the recipes, the capture and the report key on, and its
    #: quantized dirs were checked to serve (docs/quantization.md)
    quantizable: ClassVar[bool] = False

    # ---- model dirs ---------------------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def detect(cls, model_dir: str) -> bool:
        """True when ``model_dir`` (an official-layout dir of this family) is this family's.
        Cheap: reads at most a config file; never raises for a foreign or missing dir."""

    @classmethod
    @abc.abstractmethod
    def read_config(cls, model_dir: str):
        """The family's typed config from ``model_dir`` (official or converted dir).

        Raises: cosyvino.errors.ConfigError / ModelDirError."""

    @classmethod
    def source_files(cls, model_dir: str) -> tuple[str, ...]:
        """The files of an official dir a conversion is made from (recorded in manifests by
        hash, to detect a stale conversion). Default: :attr:`config_files`."""
        return cls.config_files

    @classmethod
    def presets(cls) -> tuple[str, ...]:
        """Names of the synthetic presets :meth:`make_synthetic` writes."""
        return ()

    @classmethod
    def make_synthetic(cls, preset: str, out_dir: str, **kwargs) -> str:
        """Write a random-weight model dir of ``preset`` in the official layout (needs
        torch); returns ``out_dir``."""
        raise NotImplementedError(f"family {cls.name!r} has no synthetic presets")

    # ---- model ----------------------------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def graphs(cls, config) -> GraphTable:
        """THE table of this family's exported graphs for ``config`` (sizes come from it)."""

    @classmethod
    @abc.abstractmethod
    def load_torch_model(cls, model_dir: str):
        """The family's PyTorch model from an official dir, loaded strictly (imports torch).
        Its attributes are what :attr:`GraphSpec.torch_module` factories take apart."""

    @classmethod
    def speakers(cls, model_dir: str) -> list[str]:
        """Built-in speaker names of an official dir (may import torch). Default: none."""
        return []

    @classmethod
    @abc.abstractmethod
    def stages_from_runner(cls, runner, model_dir: str):
        """The family's stages (a :class:`cosyvino.backends.Stages` subclass) over a generic
        :class:`cosyvino.backends.graphs.GraphRunner` on ``model_dir`` (a converted dir: the
        family reads its own numpy tables and speakers from there)."""

    # ---- conversion -----------------------------------------------------------------------
    @classmethod
    def write_serving_files(cls, model, model_dir: str, out_dir: str) -> list[str]:
        """Write the non-graph files a converted dir of this family needs at serving (numpy
        tables, speakers, config copies) into ``out_dir``; return their names (they are
        recorded in the manifest). ``model``: the loaded torch model. Default: copies of
        :attr:`config_files`. Raises OSError on a write."""
        import shutil

        names = []
        for name in cls.config_files:
            shutil.copyfile(os.path.join(model_dir, name), os.path.join(out_dir, name))
            names.append(name)
        return names

    @classmethod
    def export_graph(cls, model, spec: GraphSpec, *,
                     state_in_graph: bool = False) -> tuple[GraphSpec, Any]:
        """What an exporter traces for the table entry ``spec`` of the loaded torch ``model``:
        ``(traced_spec, module)``. ``traced_spec`` has the table entry's data inputs and
        outputs; a family may lay out its state otherwise for an exporter whose runtime keeps
        the state inside the graph (``state_in_graph``; the OpenVINO exporter: one state per
        layer, what the CPU plugin's stateful attention works on). The family asks for the
        capability, never for a runtime's name. Default: ``(spec, spec.torch_module(model))``.
        Imports torch (through the module factory).

        Raises ValueError: ``spec`` has no torch module."""
        if spec.torch_module is None:
            raise ValueError(f"graph {spec.name!r} has no torch module to convert")
        return spec, spec.torch_module(model)

    @classmethod
    def export_layout(cls, *, state_in_graph: bool = False) -> dict:
        """The ``llm`` manifest fields an exporter's layout of this family's stateful graph
        records (``state_in_graph``: as :meth:`export_graph`) (``cosyvino convert`` rewrites a dir whose fields differ:
        :func:`cosyvino.converted.conversion_status`). Default: none. May import torch."""
        return {}

    @classmethod
    def manifest_fields(cls, model, *, stateful: bool, llm_layout: dict | None = None) -> dict:
        """Family-specific manifest fields of a conversion of ``model`` (v1: the LLM's cache
        layout under ``llm``; ``stateful``: the runtime keeps the state in the graph;
        ``llm_layout``: the runtime's export-layout fields). Default: none."""
        return {}

    # ---- synthesis ------------------------------------------------------------------------
    #: every mode of the family, in the order a request without a mode is matched against
    #: them (the first whose flags it fits); :meth:`modes_for` says which a checkpoint offers
    modes: ClassVar[Mapping[str, Mode]] = {}

    @classmethod
    def modes_for(cls, model_dir: str | None, stages) -> dict[str, Mode]:
        """The modes a loaded checkpoint offers (a subset of :attr:`modes`, same order), e.g.
        v1: ``instruct`` only on an Instruct model, the prompt modes only where the prompt
        models are. ``model_dir``: the dir the model was loaded from (None: unknown).
        Default: every mode of the family."""
        return dict(cls.modes)

    @classmethod
    def mode_unavailable_reason(cls, model_dir: str | None, stages, name: str) -> str | None:
        """Why the checkpoint does not offer mode ``name`` (one clause, for the error that
        lists the modes it has), or None. Default: None."""
        return None

    @classmethod
    def prompt_encoder(cls, model_dir: str | None, stages, *, backend: str | None = None,
                       **options):
        """The object that turns recordings into voices for the family's prompt modes, or None
        (no voice cloning). It must be cheap to build (load its models on first use) and
        thread-safe, with:

        * ``voice(audio, *, name, prompt_text=None) -> Voice``: a prompt bundle (speaker
          embedding, prompt speech tokens, prompt mel) from a recording (anything
          :func:`cosyvino.prompt_audio.load_prompt_audio` reads);
        * ``speech_tokens(audio) -> int64 [N]``: the speech tokens of a source recording;
        * ``check_voice(voice) -> str | None``: why a stored voice does not fit this model
          (None: it fits);
        * ``close()``.

        ``backend`` names the backend that runs the prompt models (None: the family's
        choice); ``options`` go to it (e.g. ``num_threads``). Default: None."""
        return None

    @classmethod
    @abc.abstractmethod
    def new_program(cls, stages, request, draws, frontend, batchers=None):
        """A :class:`cosyvino.engine.program.Program`: the state machine of one validated
        :class:`cosyvino.request.SynthesisRequest` on loaded ``stages``, drawing its random
        numbers from ``draws`` (:class:`cosyvino.engine.draws.RandomDraws`). ``batchers``
        (given only when the engine has any): stage name -> the
        :class:`cosyvino.engine.rendezvous.CallRendezvous` the requests on ``stages`` share
        for that stage's calls (CosyVoice v1: ``"estimator"``, see :meth:`batchable_stages`)."""

    @classmethod
    def batchable_stages(cls, stages) -> dict:
        """Stage name -> the stages' function whose concurrent calls of equal shape may be
        combined along axis 0, with its cap (``{name: (fn, cap)}``; cap >= 2). Default: none."""
        return {}

    @classmethod
    def speech_vocab(cls, config) -> int | None:
        """Number of speech tokens of the model (``SynthesisRequest.speech_tokens`` must be
        below it); None = not checked."""
        return None

    @classmethod
    def speech_token_rate(cls, config) -> float | None:
        """Speech tokens per second of speech at speed 1 (CosyVoice v1: 50, sheet v1 §2;
        CosyVoice2: 25, sheet v2 §2), e.g. for the server's work estimates; None = unknown.
        Default: the flow's ``input_frame_rate`` (the rate its length regulation reads tokens
        at, in both CosyVoice yamls) when the config has one."""
        rate = getattr(getattr(config, "flow", None), "input_frame_rate", None)
        return None if rate is None else float(rate)

    @classmethod
    def decode_profile(cls, config) -> "DecodeProfile | None":
        """What one autoregressive decode step of the family's LLM touches per generated token
        (:class:`DecodeProfile`), for the planner's batch-size estimate
        (:mod:`cosyvino.planner.batching`); None = the family has no token decoder, the
        planner then does not batch."""
        return None

    @classmethod
    def batch_limits(cls) -> dict[str, int]:
        """What the family's stages can batch, whatever the backend: ``{"llm_batch": rows one
        decode step of its stages advances, "estimator_batch": requests one estimator call
        holds}``; a key absent = as the backend says (its ``Capabilities``). The planner caps
        its ``llm_batch`` / ``estimator_batch`` decisions with it. Default: ``{}``."""
        return {}

    @classmethod
    def estimator_cost(cls, config, tokens: int) -> "tuple[int, float] | None":
        """``(mel frames, GFLOP)`` of one flow-estimator call (every batch row of it) on the mel
        of ``tokens`` speech tokens, for ``cosyvino bench``'s achieved-rate rows; families count
        it with ``torch.utils.flop_counter`` on their estimator built on the meta device (no
        weights; imports torch). None: not offered, or torch is missing. Default: None."""
        return None

    @classmethod
    def pipeline(cls, stages):
        """The family's orchestration helper over loaded ``stages`` (v1:
        :class:`cosyvino.families.cosyvoice1.pipeline.Pipeline`: LLM input layout, sampling
        loop, CFM, vocoder windows), exposed as ``Synthesizer.pipeline``; None when the family
        has none."""
        return None

    @classmethod
    def make_frontend(cls, config):
        """The text frontend of this family (default: the v1 frontend)."""
        from ..frontend import TextFrontend

        return TextFrontend()


def exists_file(model_dir: str, name: str) -> bool:
    return os.path.isfile(os.path.join(os.fspath(model_dir), name))
