"""Text in, audio out: a request whose text arrives while it runs (a voice agent's chat LLM
replying token by token). Must not import torch.

:class:`TextStream` is what :meth:`cosyvino.Synthesizer.open_text_stream` returns: ``send`` text
pieces, ``flush`` to end an utterance (a sentence), ``close`` to end the text; iterate it (or
pass a ``callback``) for the :class:`~cosyvino.audio.Audio` chunks, which start before the text
is complete. The family's program (CosyVoice2/3: upstream's bistream input, sheet v2 §4.6,
:mod:`cosyvino.families.cosyvoice23.text_in_program`) decides when speech can be decoded.

Pieces may be cut anywhere: inside a word, a multi-byte character (``bytes`` pieces are UTF-8
decoded incrementally; a UTF-16 surrogate pair split over two ``str`` pieces is joined) or a
tag (``[laughter]``, ``<|endofprompt|>``); empty pieces are ignored. Same seed, same text, same
flush points -> the same audio, however the text was cut and whenever the pieces came.

Backpressure: ``send`` blocks while more than ``max_pending_tokens`` text tokens wait for the
LLM (a client that types faster than speech is made holds at most that much text here).
"""

from __future__ import annotations

import codecs
import threading
from typing import Iterable

from .errors import InputError, SynthesisCancelled

#: put in the iterable given to :meth:`cosyvino.Synthesizer.stream_text` to end an utterance
FLUSH = "\x00cosyvino-flush\x00"

#: default bound of the text tokens waiting for the LLM before ``send`` blocks
DEFAULT_MAX_PENDING_TOKENS = 256


class Utf8Pieces:
    """Text pieces as they come from a client -> whole characters.

    ``str`` pieces pass through, except that a UTF-16 surrogate pair split over two pieces
    (JSON ``"\\ud83d"`` then ``"\\ude00"``) is joined; ``bytes`` pieces are decoded as UTF-8
    incrementally (a character split over two pieces is kept until complete).

    Raises (``piece`` / ``finish``): InputError for a piece that is neither str nor bytes,
    invalid UTF-8, or a lone surrogate.
    """

    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self._high = ""  # a trailing high surrogate waiting for its low half

    def piece(self, piece) -> str:
        if isinstance(piece, (bytes, bytearray, memoryview)):
            try:
                text = self._decoder.decode(bytes(piece))
            except UnicodeDecodeError as e:
                raise InputError(f"a text piece is not valid UTF-8: {e}") from None
        elif isinstance(piece, str):
            text = piece
        else:
            raise InputError(f"text pieces must be str or bytes, got {type(piece).__name__}")
        text = self._high + text
        self._high = ""
        if text and "\ud800" <= text[-1] <= "\udbff":
            text, self._high = text[:-1], text[-1]
        return _join_surrogates(text)

    def finish(self) -> None:
        """The text ended: InputError if it ends inside a character."""
        try:
            self._decoder.decode(b"", final=True)
        except UnicodeDecodeError as e:
            self._decoder.reset()
            raise InputError(f"the text ends inside a UTF-8 character: {e}") from None
        if self._high:
            self._high = ""
            raise InputError("the text ends with a lone UTF-16 surrogate")


def _join_surrogates(text: str) -> str:
    if not any("\ud800" <= c <= "\udfff" for c in text):
        return text
    try:
        return text.encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeDecodeError:
        raise InputError("a text piece holds a lone UTF-16 surrogate") from None


class TextStream:
    """One text-in request (module docstring); made by
    :meth:`cosyvino.Synthesizer.open_text_stream`.

    Iterating yields the chunks (``stats`` as :class:`cosyvino.synthesizer.ChunkStream`;
    ``segment`` counts utterances) and ends after :meth:`close` once the last utterance is
    spoken; it raises what the request raised (EmptyTextError when no utterance had anything
    speakable, SynthesisCancelled after :meth:`cancel`).
    """

    def __init__(self, handle, *, max_pending_tokens: int = DEFAULT_MAX_PENDING_TOKENS):
        if isinstance(max_pending_tokens, bool) or not isinstance(max_pending_tokens, int) \
                or max_pending_tokens < 1:
            raise InputError(f"max_pending_tokens must be a positive integer, got "
                             f"{max_pending_tokens!r}")
        self._handle = handle
        self._program = handle.state.program
        self._pieces = Utf8Pieces()
        self._lock = threading.Lock()  # one feeder at a time: pieces keep their order
        self.max_pending_tokens = max_pending_tokens
        self.seed = handle.state.request.seed
        self.closed = False

    @property
    def handle(self):
        """The scheduler's :class:`~cosyvino.engine.RequestHandle`."""
        return self._handle

    @property
    def pending_text_tokens(self) -> int:
        """Text tokens sent and not yet taken by the LLM."""
        return self._program.pending_text_tokens

    @property
    def utterances_dropped(self) -> int:
        """Utterances flushed with nothing speakable in them (no audio for them)."""
        return self._program.utterances_dropped

    def _check_running(self) -> None:
        if self._handle.state.cancel.is_set():
            raise SynthesisCancelled("synthesis cancelled")

    def send(self, piece: str | bytes, timeout: float | None = None) -> None:
        """Add a text piece (str, or UTF-8 bytes cut anywhere). Blocks while more than
        ``max_pending_tokens`` tokens wait for the LLM (at most ``timeout`` s: then
        TimeoutError; None: no limit).

        Raises: InputError (not text, bad UTF-8, after :meth:`close`), SynthesisCancelled
        (cancelled), TimeoutError."""
        with self._lock:
            if self.closed:
                raise InputError("text sent after the text stream was closed")
            self._check_running()
            text = self._pieces.piece(piece)
            if not self._program.wait_for_room(self.max_pending_tokens, timeout):
                raise TimeoutError(f"the synthesis did not take the text within {timeout} s")
            self._check_running()
            self._program.feed_text(text)

    def flush(self) -> bool:
        """End the current utterance (its rest is decoded now; later text starts the next
        one). Returns False when it had nothing speakable (dropped, no audio). Raises
        InputError (after :meth:`close`, text ending inside a character)."""
        with self._lock:
            if self.closed:
                raise InputError("flush after the text stream was closed")
            self._pieces.finish()
            return self._program.end_utterance()

    def close(self) -> None:
        """End the text (flushing the current utterance); iteration ends after its audio.
        Idempotent. Raises InputError when the text ends inside a character (the stream is
        closed anyway)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            try:
                self._pieces.finish()
            finally:
                self._program.close_input()

    def cancel(self) -> None:
        """Stop the request (within one stage call); iteration raises SynthesisCancelled."""
        self._handle.cancel()
        waker = getattr(self._program, "_waker", None)
        if waker is not None:
            waker()  # a request waiting for text has no step running to notice the cancel

    # ---- audio ------------------------------------------------------------------------------
    def __iter__(self) -> "TextStream":
        return self

    def __next__(self):
        return next(self._handle)

    def __enter__(self) -> "TextStream":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()


def feed(stream: TextStream, pieces: Iterable, stop: threading.Event) -> BaseException | None:
    """Send ``pieces`` (str / bytes; :data:`FLUSH` ends an utterance) to ``stream``, then
    close it; returns the exception that stopped it (the stream is then cancelled) or None."""
    try:
        for piece in pieces:
            if stop.is_set():
                return None
            if isinstance(piece, str) and piece == FLUSH:
                stream.flush()
            else:
                stream.send(piece)
        stream.close()
        return None
    except SynthesisCancelled:
        return None
    except BaseException as e:  # the caller's iterator failed, or a bad piece
        stream.cancel()
        return e
