"""``cosyvino download MODEL``: fetch an official CosyVoice checkpoint with the hub's own client
library (``huggingface_hub.snapshot_download``, or ModelScope's ``snapshot_download``), so
``cosyvino serve --model-dir D`` has real weights. See docs/server.md, "Getting the model".

The known names and their repository ids are the families' (``ModelFamily.download_ids``:
CosyVoice-300M*, CosyVoice2-0.5B, Fun-CosyVoice3-0.5B-2512). The hub clients resume
interrupted downloads and skip files already there; afterwards the registered families are
asked which of them the directory is (:meth:`ModelFamily.detect`). Every failure (client
library missing, offline, no such repository, a dir no family recognizes) is a
:class:`DownloadError`: one line, exit status 2.
"""

from __future__ import annotations

import os

import click

from cosyvino.cli.errors import friendly_errors
from cosyvino.errors import CosyvinoError

SOURCES = ("huggingface", "modelscope")


def known_models() -> dict[str, dict[str, str]]:
    """Model name -> repository id per hub, from every registered family's
    ``download_ids`` (the ids of the upstream README's download section,
    github.com/FunAudioLLM/CosyVoice), in family-name order."""
    from cosyvino.families import family_classes

    out: dict[str, dict[str, str]] = {}
    for _, cls in sorted(family_classes().items()):
        for name, ids in (getattr(cls, "download_ids", None) or {}).items():
            out[name] = dict(ids)
    return out


def __getattr__(name: str):
    # ``KNOWN_MODELS`` stays importable; computed on use because families register through
    # the plugin hook
    if name == "KNOWN_MODELS":
        return known_models()
    raise AttributeError(name)


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
    known = known_models()
    for name, ids in known.items():
        if model.lower() == name.lower():
            if source not in ids:
                raise DownloadError(f"{name} has no {source} id; use one of "
                                    f"{', '.join(sorted(ids))} (or give a repository id)")
            return ids[source], name
    if model.count("/") == 1 and all(model.split("/")):
        return model, model.split("/")[1]
    raise DownloadError(f"unknown model {model!r}; known: {', '.join(known)} (or give "
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


def downloaded_family(model_dir: str) -> str:
    """The name of the registered family whose :meth:`ModelFamily.detect` accepts
    ``model_dir`` (third-party families first, then by name). Unlike
    :func:`cosyvino.families.detect_family` there is no fallback to v1: a dir nobody
    recognizes is an error here.

    Raises:
        DownloadError: no family recognizes it; the message (a clause: "not a model dir ...",
            "an official ... dir ...") says which official yaml, if any, the dir has."""
    from cosyvino.families import family_classes, recognized_family
    from cosyvino.families.official import OFFICIAL_YAMLS, official_family

    name = recognized_family(model_dir)
    if name is not None:
        return name
    classes = family_classes()
    official = official_family(model_dir)
    yamls = ", ".join(y for _, y in OFFICIAL_YAMLS[:-1]) + f" or {OFFICIAL_YAMLS[-1][1]}"
    if official is not None:
        raise DownloadError(f"an official {official} dir that no registered family accepts "
                            f"(registered: {', '.join(sorted(classes))})")
    raise DownloadError(f"not a model dir any registered family recognizes (no {yamls})")


def download_model(model: str, dest: str | None = None, source: str = "huggingface", *,
                   revision: str | None = None) -> str:
    """Download ``model`` (see :func:`resolve_model`) from ``source`` into ``dest`` (default
    ``./pretrained_models/<name>``); returns the directory (:func:`downloaded_family` names
    its family).

    Raises:
        DownloadError: the client library is not installed, the hub cannot be reached (the
            message says so; set ``HF_ENDPOINT`` / ``MODELSCOPE_DOMAIN`` for a mirror), the
            repository does not exist, or what arrived is no model dir a registered family
            recognizes.
    """
    repo_id, name = resolve_model(model, source)
    dest = os.path.abspath(dest or os.path.join("pretrained_models", name))
    snapshot_download = _snapshot_download(source)
    try:
        snapshot_download(repo_id, revision=revision, local_dir=dest)
    except Exception as e:  # noqa: BLE001 - each hub client raises its own error types
        raise DownloadError(_explain(e, repo_id, source)) from None
    try:
        downloaded_family(dest)
    except DownloadError as e:
        raise DownloadError(f"downloaded {repo_id} to {dest}, but it is {e}") from None
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
    CosyVoice-300M-Instruct, CosyVoice2-0.5B, Fun-CosyVoice3-0.5B-2512 or a repository id
    (owner/name).

    Then: cosyvino serve --model-dir DIR (or cosyvino convert / plan first; docs/server.md).
    """
    repo_id, _ = resolve_model(model, source)
    click.echo(f"downloading {repo_id} from {source} ...", err=True)
    path = download_model(model, dest, source, revision=revision)
    click.echo(f"downloaded {repo_id} to {path} (family {downloaded_family(path)})", err=True)
    click.echo(path)
