"""Weight-norm folding for official CosyVoice checkpoints (HiFT vocoder).

Official ``hift.pt`` files store each weight-normed convolution as a pair (g, v) instead of a
plain ``weight``; the effective weight is ``g * v / ||v||`` with the norm taken over every axis
except axis 0 (``torch.nn.utils.weight_norm(..., dim=0)``). Two spellings exist:

- ``X.parametrizations.weight.original0`` (g) / ``X.parametrizations.weight.original1`` (v):
  ``torch.nn.utils.parametrizations.weight_norm`` (upstream HEAD, CosyVoice2 ``hift.pt``);
- ``X.weight_g`` (g) / ``X.weight_v`` (v): the older ``torch.nn.utils.weight_norm``.

Folding into ``X.weight`` is exact for inference. For ``Conv1d`` v is [out, in, k] and g
[out, 1, 1]; for ``ConvTranspose1d`` v is [in, out, k] and g [in, 1, 1]: the same axis-0 rule.

This module does not import torch (or numpy): values are operated on by duck typing, so a
state_dict of numpy arrays or of torch tensors works alike (anything with ``shape``,
``reshape``, ``sum(axis=..., keepdims=...)``, ``**``, ``*`` and ``/``). Values that are not
touched are passed through as the same objects.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

_PARAM_G = ".parametrizations.weight.original0"
_PARAM_V = ".parametrizations.weight.original1"
_OLD_G = ".weight_g"
_OLD_V = ".weight_v"

SPELLINGS = ("parametrizations", "weight_g")


def _norm_except_dim0(v: Any) -> Any:
    """L2 norm of ``v`` over all axes except 0, shaped [v.shape[0], 1, ..., 1] (ndim of v)."""
    flat = v.reshape(v.shape[0], -1)
    norm = (flat * flat).sum(axis=1, keepdims=True) ** 0.5
    return norm.reshape((v.shape[0],) + (1,) * (len(v.shape) - 1))


def fold_weight_norm(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Replace every weight-norm pair by a plain ``X.weight = g * v / ||v||``.

    Accepts both spellings (see module docstring), also mixed in one dict. Key order is kept:
    the folded ``X.weight`` takes the place of the first key of its pair. Other keys pass through.

    Args:
        state_dict: name -> tensor/array (float32 in official files; dtype is preserved).

    Returns:
        A new dict (the input is not modified).

    Raises:
        KeyError: a g without its v or a v without its g, or a pair whose ``X.weight`` also exists.
        ValueError: g and v shapes disagree (g must be [v.shape[0], 1, ..., 1]).
    """
    out: dict[str, Any] = {}
    pairs = ((_PARAM_G, _PARAM_V), (_OLD_G, _OLD_V))
    for key, value in state_dict.items():
        for g_suffix, v_suffix in pairs:
            if key.endswith(g_suffix) or key.endswith(v_suffix):
                is_g = key.endswith(g_suffix)
                base = key[: -len(g_suffix if is_g else v_suffix)]
                wkey = base + ".weight"
                if wkey in out:
                    break  # the other half of this pair already produced the weight
                if wkey in state_dict:
                    raise KeyError(f"{wkey!r} present together with its weight-norm pair {key!r}")
                gkey, vkey = base + g_suffix, base + v_suffix
                if gkey not in state_dict or vkey not in state_dict:
                    missing = vkey if is_g else gkey
                    raise KeyError(f"weight-norm key {key!r} has no partner {missing!r}")
                g, v = state_dict[gkey], state_dict[vkey]
                expect = (v.shape[0],) + (1,) * (len(v.shape) - 1)
                if tuple(g.shape) != expect:
                    raise ValueError(f"{gkey!r} has shape {tuple(g.shape)}, expected {expect} "
                                     f"for {vkey!r} of shape {tuple(v.shape)}")
                out[wkey] = v * (g / _norm_except_dim0(v))
                break
        else:
            out[key] = value
    return out


def unfold_weight_norm(state_dict: Mapping[str, Any], weight_normed_names: Iterable[str],
                       spelling: str = "parametrizations") -> dict[str, Any]:
    """Inverse of :func:`fold_weight_norm`: write ``X.weight`` as a (g, v) pair.

    g = ||w|| over all axes except 0 (shape [w.shape[0], 1, ..., 1]) and v = w, so that
    ``fold_weight_norm`` gives back ``w`` (to float rounding). Used to write synthetic
    checkpoints in the official layout. Note that (g, v) is not unique (any positive rescaling of
    v gives the same weight), so ``unfold(fold(sd))`` reproduces an official ``sd`` only up to
    that rescaling; ``fold(unfold(fold(sd))) == fold(sd)`` always holds.

    Args:
        state_dict: name -> tensor/array with plain ``X.weight`` entries.
        weight_normed_names: the ``X.weight`` names to unfold (e.g.
            ``HiFTGenerator.weight_normed_parameters()``).
        spelling: ``"parametrizations"`` (``X.parametrizations.weight.original0/1``, upstream
            HEAD) or ``"weight_g"`` (``X.weight_g`` / ``X.weight_v``).

    Returns:
        A new dict; each unfolded pair takes the place of its ``X.weight`` (g first, then v).

    Raises:
        ValueError: unknown spelling or a name not ending in ``.weight``.
        KeyError: a listed name is not in ``state_dict``.
    """
    if spelling == "parametrizations":
        g_suffix, v_suffix = _PARAM_G, _PARAM_V
    elif spelling == "weight_g":
        g_suffix, v_suffix = _OLD_G, _OLD_V
    else:
        raise ValueError(f"unknown weight-norm spelling {spelling!r}; use one of {SPELLINGS}")
    names = set()
    for name in weight_normed_names:
        if not name.endswith(".weight"):
            raise ValueError(f"weight-normed name {name!r} must end in '.weight'")
        if name not in state_dict:
            raise KeyError(f"weight-normed parameter {name!r} not in state_dict")
        names.add(name)
    out: dict[str, Any] = {}
    for key, value in state_dict.items():
        if key in names:
            base = key[: -len(".weight")]
            out[base + g_suffix] = _norm_except_dim0(value)
            out[base + v_suffix] = value
        else:
            out[key] = value
    return out


def strip_generator_prefix(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Delete the substring ``generator.`` from every key, as the official HiFT loader does.

    Checkpoints saved from the GAN training wrapper (``HiFiGan.generator``) then load into a
    bare ``HiFTGenerator`` (upstream ``cosyvoice/cli/model.py``, ``load``).

    Raises:
        KeyError: two keys collide after stripping.
    """
    out: dict[str, Any] = {}
    for key, value in state_dict.items():
        new = key.replace("generator.", "")
        if new in out:
            raise KeyError(f"key {key!r} collides with another key after removing 'generator.'")
        out[new] = value
    return out
