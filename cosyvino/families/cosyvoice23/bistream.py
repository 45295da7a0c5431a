"""The LLM input layout and decoding rule of text streamed in (upstream ``inference_bistream``,
sheet v2 §4.6), as a state machine over ids. Numpy only; no model.

Text tokens arrive one at a time (:meth:`BistreamLayout.push` queues them; they are taken one
by one, as upstream's generator yields them). The prompt transcript is queued first; while
prompt speech tokens are left, each 5 queued text tokens go into the input with the next 15
prompt speech tokens (mix ratio 5 : 15). Then speech is decoded in groups: after 5 text
tokens, up to 15 speech tokens; position ``next_fill`` (``(P // 15 + 1) · 15 − P`` for ``P``
prompt speech tokens, then every 16th) is the FILL token 6563, forced without a draw, which
ends the group; a sampled FILL ends it early and moves the next forced one to 16 after it.
After a FILL the next 5 text tokens REPLACE the pending input (the FILL is never fed). When the
text ends: ``pending input ⧺ queued text ⧺ [TASK]``, then decode until EOS.

Where upstream raises ``ValueError`` (a draw of an id >= the speech vocabulary other than FILL
in a group, or other than EOS at the end) this rule masks that id before the draw instead, and
the end phase stops after ``max_len`` tokens (upstream has no bound there): see
:meth:`BistreamLayout.decide`.

The ``out`` list holds the FILL entries too: they count for ``next_fill`` and for the RAS
window, as upstream. A pending input that was already fed stays pending when a group ends on a
FILL, so at the end phase it is fed again before the remaining text (upstream's quirk, sheet
v2 §4.6, "Open questions"); kept for parity.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable

import numpy as np

#: kinds of the parts of an LLM input (:class:`Part`)
SOS, TASK, TEXT, SPEECH = "sos", "task", "text", "speech"

#: decisions of :meth:`BistreamLayout.decide`
EMIT, FILL, END = "emit", "fill", "end"


@dataclass(frozen=True)
class Part:
    """A run of LLM input positions: ``kind`` (SOS / TASK: one position, ``ids`` empty; TEXT:
    Qwen2 ids; SPEECH: speech-token ids)."""

    kind: str
    ids: tuple[int, ...] = ()

    @property
    def positions(self) -> int:
        return 1 if self.kind in (SOS, TASK) else len(self.ids)


@dataclass(frozen=True)
class BistreamTokens:
    """The special ids and the mix ratio (sheet v2 §4.1: speech vocabulary 6561, EOS 6561,
    FILL 6563, mix 5 : 15)."""

    speech_token_size: int = 6561
    eos_token: int = 6561
    fill_token: int = 6563
    mix_text: int = 5
    mix_speech: int = 15


#: ``sample(logp [V] float32, history) -> id``: one seeded RAS draw
Sample = Callable[[np.ndarray, list], int]


class BistreamLayout:
    """One utterance of streamed text (module docstring).

    Args:
        prompt_text: Qwen2 ids queued before the streamed text (zero-shot transcript,
            instruction; empty: none).
        prompt_speech: LLM prompt speech tokens (zero-shot; empty: none).
        tokens: :class:`BistreamTokens`.
        placed_text: Qwen2 ids placed right after SOS, before any interleaving (CosyVoice3:
            the instruction up to ``<|endofprompt|>``; v2: none).
        max_len: most speech tokens of the end phase (upstream: unbounded).

    Use: :meth:`push` ids, :meth:`end` once; while :meth:`forward_due` gives parts, feed them
    to the LLM and pass its log-probabilities to :meth:`decide`; :attr:`done` at the end.
    """

    def __init__(self, prompt_text=(), prompt_speech=(), tokens: BistreamTokens | None = None,
                 *, placed_text=(), max_len: int | None = None):
        self.tokens = tokens or BistreamTokens()
        self.text: collections.deque[int] = collections.deque(int(t) for t in prompt_text)
        self.speech: collections.deque[int] = collections.deque(int(t) for t in prompt_speech)
        self.incoming: collections.deque[int] = collections.deque()
        self.lm_input: list[Part] = [Part(SOS)]
        if len(placed_text):
            self.lm_input.append(Part(TEXT, tuple(int(t) for t in placed_text)))
        self.out: list[int] = []
        p = len(self.speech)
        self.next_fill = (p // self.tokens.mix_speech + 1) * self.tokens.mix_speech - p
        self.ended = False
        self.in_loop = False  # inside a decode group (a forward of lm_input is due)
        self.final = False  # the end phase (decode until EOS)
        self.done = False
        self.max_len = max_len
        self._final_emitted = 0

    # ---- text -------------------------------------------------------------------------------
    def push(self, ids) -> None:
        """Queue streamed text ids (taken one by one by :meth:`forward_due`)."""
        if self.ended:
            raise RuntimeError("text pushed after end()")
        self.incoming.extend(int(t) for t in ids)

    def end(self) -> None:
        """The text has ended (taken once every queued id is)."""
        self.ended = True

    @property
    def waiting(self) -> int:
        """Streamed ids queued and not taken yet."""
        return len(self.incoming)

    def _positions(self) -> int:
        return sum(p.positions for p in self.lm_input)

    def _take_text(self, n: int) -> Part:
        return Part(TEXT, tuple(self.text.popleft() for _ in range(n)))

    def forward_due(self) -> list[Part] | None:
        """The parts to feed now (taking queued text ids one at a time until a decode starts),
        or None when more text is needed (or :attr:`done`)."""
        if self.done:
            return None
        if self.in_loop:
            return list(self.lm_input)
        t = self.tokens
        while self.incoming:
            self.text.append(self.incoming.popleft())
            while self.speech and len(self.text) >= t.mix_text:
                self.lm_input.append(self._take_text(t.mix_text))
                self.lm_input.append(Part(SPEECH, tuple(self.speech.popleft()
                                                        for _ in range(min(t.mix_speech,
                                                                           len(self.speech))))))
            if self.speech:
                continue
            after_fill = bool(self.out) and self.out[-1] == t.fill_token
            if after_fill or (not self.out and self._positions() == 1):
                if len(self.text) < t.mix_text:
                    continue
                part = self._take_text(t.mix_text)
                self.lm_input = [part] if after_fill else self.lm_input + [part]
            self.in_loop = True
            return list(self.lm_input)
        if self.ended:
            rest = [self._take_text(len(self.text))] if self.text else []
            self.lm_input = self.lm_input + rest + [Part(TASK)]
            self.in_loop = self.final = True
            return list(self.lm_input)
        return None

    # ---- decisions --------------------------------------------------------------------------
    def decide(self, logp: np.ndarray, sample: Sample) -> tuple[str, int | None]:
        """After feeding :meth:`forward_due`'s parts, ``logp`` float32 [V + 3] of the last
        position -> ``(EMIT, token)``, ``(FILL, None)`` (the group ended; more text needed) or
        ``(END, None)`` (EOS, or ``max_len`` tokens in the end phase: the utterance is done).

        In a group EOS is masked (upstream ``ignore_eos=True``) and so is every other id >=
        the speech vocabulary except FILL; in the end phase every such id except EOS."""
        t = self.tokens
        size = t.speech_token_size
        logp = np.array(logp, dtype=np.float32, copy=True)
        if not self.final:
            if len(self.out) == self.next_fill:
                tok = t.fill_token
                self.next_fill += t.mix_speech + 1
            else:
                logp[[i for i in range(size, logp.size) if i != t.fill_token]] = -np.inf
                tok = int(sample(logp, self.out))
            if tok == t.fill_token:
                self.next_fill = len(self.out) + t.mix_speech + 1
                self.out.append(tok)
                self.in_loop = False
                return FILL, None
            self.out.append(tok)
            self.lm_input = [Part(SPEECH, (tok,))]
            return EMIT, tok
        logp[[i for i in range(size, logp.size) if i != t.eos_token]] = -np.inf
        tok = int(sample(logp, self.out))
        self.out.append(tok)
        if tok == t.eos_token:
            self.done, self.in_loop = True, False
            return END, None
        self._final_emitted += 1
        self.lm_input = [Part(SPEECH, (tok,))]
        if self.max_len is not None and self._final_emitted >= self.max_len:
            self.done, self.in_loop = True, False
            return EMIT, tok  # the caller ends the utterance after it (see :attr:`done`)
        return EMIT, tok
