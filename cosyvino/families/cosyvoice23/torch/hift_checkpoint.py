"""Reading a CosyVoice2/3 ``hift.pt`` into checked key -> tensor pairs (sheet v2 §6.4, v3 §6):
what the two families' vocoder loaders share before each folds the weight norm its own way.
Imports torch (through the loaded file only)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from cosyvino.errors import CheckpointError
from cosyvino.families.cosyvoice1.checkpoint import check_state_dict, load_torch_file
from cosyvino.families.cosyvoice1.weight_norm import strip_generator_prefix

#: the old weight-norm spelling's suffix (``X.weight_g`` / ``X.weight_v``)
WEIGHT_G = ".weight_g"
_HINT = ("hift.pt weight-norm keys use 'X.parametrizations.weight.original0/1' "
         "(or all of them 'X.weight_g'/'X.weight_v')")


def read_hift_state_dict(path: str, expected: Callable[[str], Mapping[str, Sequence[int]]], *,
                         config_name: str) -> dict:
    """``path``'s state dict with upstream's ``generator.`` prefix removed, its keys and shapes
    checked against ``expected(spelling)`` (``spelling``: ``"weight_g"`` when the file uses the
    old weight-norm keys, else ``"parametrizations"``). Values are returned as stored.

    Raises:
        CheckpointError: unreadable file, not a state dict, or missing/unexpected keys or wrong
            shapes (named, with ``config_name`` as the architecture's source).
    """
    raw = load_torch_file(path)
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a state_dict (name -> tensor), got "
                              f"{type(raw).__name__}", path)
    try:
        sd = strip_generator_prefix(raw)
    except KeyError as e:
        raise CheckpointError(f"{path}: {e.args[0]}", path) from None
    spelling = "weight_g" if any(k.endswith(WEIGHT_G) for k in sd) else "parametrizations"
    check_state_dict(sd, expected(spelling), path, hint=_HINT, config_name=config_name)
    return sd
