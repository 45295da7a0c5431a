"""``cosyvino download MODEL``: fetch an official CosyVoice checkpoint with the hub's own client
library (``huggingface_hub.snapshot_download``, or ModelScope's ``snapshot_download``), so
``cosyvino serve --model-dir D`` has real weights. See docs/server.md, "Getting the model".

The hub clients resume interrupted downloads and skip files already there; the directory is
checked for ``cosyvoice.yaml`` afterwards. Every failure (client library missing, offline, no
such repository) is a :class:`DownloadError`: one line, exit status 2.
"""

from __future__ import annotations

import os

import click

from cosyvino.cli.errors import friendly_errors
from cosyvino.errors import CosyvinoError

SOURCES = ("huggingface", "modelscope")

#: model name -> repository id per hub (the ids of the upstream README's download section,
#: github.com/FunAudioLLM/CosyVoice)
KNOWN_MODELS: dict[str, dict[str, str]] = {
    "CosyVoice-300M": {"huggingface": "FunAudioLLM/CosyVoice-300M",
                       "modelscope": "iic/CosyVoice-300M"},
    "CosyVoice-300M-SFT": {"huggingface": "FunAudioLLM/CosyVoice-300M-SFT",
                           "modelscope": "iic/CosyVoice-300M-SFT"},
    "CosyVoice-300M-Instruct": {"huggingface": "FunAudioLLM/CosyVoice-300M-Instruct",
                                "modelscope": "iic/CosyVoice-300M-Instruct"},
}

#: the pip requirement that provides each hub's client
_CLIENTS = {"huggingface": ("huggingface_hub", "pip install 'cosyvino[download]' "
                            "(huggingface-hub)"),
            "modelscope": ("modelscope", "pip install modelscope")}


class DownloadError(CosyvinoError):
    """A model could not be downloaded (client library missing, offline, unknown model)."""


def resolve_model(model: str, source: str) -> tuple[str, str]:
    """``(repo_id, name)`` of ``model``: a name of :data:`KNOWN_MODELS` (case-insensitive) or
    a repository id ``owner/name`` (taken as it is). Raises DownloadError for anything else
    or an unknown ``source``."""
    if source not in SOURCES:
        raise DownloadError(f"unknown source {source!r}; choose one of {', '.join(SOURCES)}")
    for name, ids in KNOWN_MODELS.items():
        if model.lower() == name.lower():
            return ids[source], name
    if model.count("/") == 1 and all(model.split("/")):
        return model, model.split("/")[1]
    raise DownloadError(f"unknown model {model!r}; known: {', '.join(KNOWN_MODELS)} (or give "
                        "a repository id, owner/name)")


def _snapshot_download(source: str):
    module, how = _CLIENTS[source]
    try:
        if source == "huggingface":
            from huggingface_hub import snapshot_download
        else:
            from modelscope import snapshot_download
    except ImportError:
        raise DownloadError(f"downloading from {source} needs the {module} package: {how}"
                            ) from None
    return snapshot_download


def download_model(model: str, dest: str | None = None, source: str = "huggingface", *,
                   revision: str | None = None) -> str:
    """Download ``model`` (see :func:`resolve_model`) from ``source`` into ``dest`` (default
    ``./pretrained_models/<name>``); returns the directory.

    Raises:
        DownloadError: the client library is not installed, the hub cannot be reached (the
            message says so; set ``HF_ENDPOINT`` / ``MODELSCOPE_DOMAIN`` for a mirror), the
            repository does not exist, or what arrived has no ``cosyvoice.yaml``.
    """
    repo_id, name = resolve_model(model, source)
    dest = os.path.abspath(dest or os.path.join("pretrained_models", name))
    snapshot_download = _snapshot_download(source)
    try:
        snapshot_download(repo_id, revision=revision, local_dir=dest)
    except Exception as e:  # noqa: BLE001 - each hub client raises its own error types
        raise DownloadError(_explain(e, repo_id, source)) from None
    if not os.path.isfile(os.path.join(dest, "cosyvoice.yaml")):
        raise DownloadError(f"downloaded {repo_id} to {dest}, but it has no cosyvoice.yaml: "
                            "not a CosyVoice v1 model directory")
    return dest


def _explain(e: Exception, repo_id: str, source: str) -> str:
    kind = type(e).__name__
    detail = " ".join(str(e).split())[:300]
    if "NotFound" in kind and "Entry" not in kind:  # RepositoryNotFoundError & co.
        return f"{repo_id} not found on {source} ({kind}): {detail}"
    hint = ("set HF_ENDPOINT to use a mirror" if source == "huggingface"
            else "set MODELSCOPE_DOMAIN to use a mirror")
    return (f"cannot download {repo_id} from {source} (offline or the hub unreachable? "
            f"{hint}, or copy the model directory here yourself): {kind}: {detail}")


@click.command()
@click.argument("model")
@click.option("--dir", "dest", type=click.Path(file_okay=False), default=None,
              help="Where to put it. Default: ./pretrained_models/NAME.")
@click.option("--source", type=click.Choice(SOURCES), default="huggingface",
              show_default=True,
              help="Which hub: Hugging Face (huggingface-hub) or ModelScope (modelscope).")
@click.option("--revision", default=None, help="A branch, tag or commit of the repository.")
@friendly_errors
def download(model, dest, source, revision):
    """Download an official CosyVoice checkpoint: MODEL is CosyVoice-300M, CosyVoice-300M-SFT,
    CosyVoice-300M-Instruct or a repository id (owner/name).

    Then: cosyvino serve --model-dir DIR (or cosyvino convert / plan first; docs/server.md).
    """
    repo_id, _ = resolve_model(model, source)
    click.echo(f"downloading {repo_id} from {source} ...", err=True)
    path = download_model(model, dest, source, revision=revision)
    click.echo(f"downloaded {repo_id} to {path}", err=True)
    click.echo(path)
