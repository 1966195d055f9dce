"""The Hugging Face Hub as the user's environment allows it.

arbor never sets ``HF_HUB_OFFLINE`` itself. A Hub id (``policy.model``, ``memory.embedder``, a guidance generator,
or a question set ``hf:...`` in ``data.train`` / ``data.eval``) is downloaded into the Hugging Face cache when the
environment allows it, and read from that cache alone when ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` is truthy
(huggingface_hub's own rule; the Makefile and the tests set them, so CI stays offline by its own setting).

Question sets on the Hub (a dataset repository ``<owner>/<name>``; ``@<revision>`` optional, URL-encoded when it
holds a ``/``, e.g. ``@refs%2Fconvert%2Fparquet``):

- ``hf:<owner>/<name>[@<revision>]/<path in repo>``: one file, Parquet or JSONL, read like a local file
  (e.g. ``hf:PeterJinGo/nq_hotpotqa_train/train.parquet``, ``hf:RUC-NLPIR/FlashRAG_datasets/nq/dev.jsonl``).
- ``hf:<owner>/<name>[@<revision>][/<folder>]:<split>``: the split's Parquet files (else its JSONL files) under
  ``folder`` (default: the whole repository), named as the Hub names splits: ``<split>.<ext>``,
  ``<split>-<shard>.<ext>`` or ``<split>/<file>``, at any depth (``data/train-00000-of-00001.parquet``). They must
  lie in one folder: a repository with a folder per configuration is refused naming them (``hf:X/nq:train``).

Offline, the files come from the cache (``hf download <owner>/<name> --repo-type dataset`` fills it); a split is
read only when every one of its files is cached as far as the cache's own listing of the repository tells.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HUB_PREFIX = "hf"  # the question-set prefix: hf:<owner>/<name>...
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
DATA_SUFFIXES = (".parquet", ".jsonl")  # what read_questions reads, preferred in this order for a split


class HubError(ValueError):
    """A Hub id that cannot be resolved here; the message names the id and how to fix it."""


def offline_variable(env: Mapping[str, str] | None = None) -> str | None:
    """The variable that keeps the Hub offline here (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``, truthy as
    huggingface_hub reads them), or None: downloads are allowed. Without ``env``: the process's environment, or
    huggingface_hub's offline mode when this process started it offline."""
    from huggingface_hub import constants

    for name in OFFLINE_VARIABLES:
        value = (os.environ if env is None else env).get(name)
        if value is not None and value.upper() in constants.ENV_VARS_TRUE_VALUES:
            return name
    if env is None and constants.is_offline_mode():
        return "HF_HUB_OFFLINE"
    return None


def cache_dir() -> str:
    """The Hugging Face Hub cache this process reads (``HF_HUB_CACHE``, else ``HF_HOME``/hub)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def offline_fix(var: str, download: str) -> str:
    """How to fix an uncached id while ``var`` keeps the Hub offline (for an error message)."""
    return (f"the Hub is offline here ({var}={os.environ.get(var, '1')}) and it is not in the Hugging Face cache "
            f"{cache_dir()}: download it first where there is internet (`{download}`, into this cache or one named "
            f"by HF_HUB_CACHE), or unset {var} to let the run download it")


def is_hub_id(name: str) -> bool:
    """``name`` is a well-formed Hub repository id (``name`` or ``owner/name``), not a path."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def model_cached(model: str) -> bool:
    """A Hub model id whose ``config.json`` is in the local cache (no network)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(model, "config.json"), str)
    except Exception:  # noqa: BLE001 - an id the cache cannot hold is simply not cached
        return False


# ----------------------------------------------------------------------------------------------- dataset specs


@dataclass(frozen=True)
class HubDataset:
    """A parsed ``hf:`` spec: one ``path`` in the repository, or a ``split`` under the folder ``path``."""

    spec: str
    repo: str
    revision: str | None
    path: str
    split: str | None

    def download_command(self) -> str:
        """The ``hf download`` command that fills the cache with what this spec reads."""
        rev = f" --revision {self.revision}" if self.revision else ""
        what = f" {self.path}" if self.split is None else ""
        return f"hf download {self.repo}{what} --repo-type dataset{rev}"


def is_hub_spec(spec: str) -> bool:
    """``spec`` names a question set on the Hub (``hf:...``)."""
    return spec.startswith(HUB_PREFIX + ":")


def parse_dataset_spec(spec: str) -> HubDataset:
    """Parse ``hf:<owner>/<name>[@<revision>]/<file>`` or ``hf:<owner>/<name>[@<revision>][/<folder>]:<split>``."""
    from huggingface_hub.errors import HfUriError
    from huggingface_hub.utils import parse_hf_uri

    forms = ("hf:<owner>/<name>/<file in the repository> or hf:<owner>/<name>[/<folder>]:<split>, e.g. "
             "hf:PeterJinGo/nq_hotpotqa_train/train.parquet")
    body = spec.removeprefix(HUB_PREFIX + ":")
    where, sep, split = body.partition(":")
    if sep and (not split or "/" in split):
        raise HubError(f"{spec!r}: a split after ':' is one name (train, test, ...); expected {forms}")
    try:
        uri = parse_hf_uri("hf://datasets/" + where)
    except HfUriError as e:
        raise HubError(f"{spec!r}: not a Hub dataset id ({e}); expected {forms}") from e
    path = uri.path_in_repo.strip("/")
    if ".." in path.split("/"):
        raise HubError(f"{spec!r}: a path in the repository may not hold '..'")
    if not sep and not path.endswith(DATA_SUFFIXES):
        raise HubError(f"{spec!r}: name a {' or '.join(DATA_SUFFIXES)} file in the repository or a split; "
                       f"expected {forms}")
    return HubDataset(spec, uri.id, uri.revision, path, split or None)


def _split_patterns(ds: HubDataset, suffix: str) -> list[str]:
    """fnmatch patterns (``*`` spans folders, as huggingface_hub matches them) of the split's files."""
    top = f"{ds.path}/" if ds.path else ""
    s = ds.split
    return [f"{top}{s}{suffix}", f"{top}{s}-*{suffix}", f"{top}{s}/*{suffix}",
            f"{top}*/{s}{suffix}", f"{top}*/{s}-*{suffix}", f"{top}*/{s}/*{suffix}"]


def split_files(ds: HubDataset, names: list[str]) -> list[str]:
    """The files of ``ds.split`` among a repository's file ``names`` (Parquet, else JSONL), sorted; [] when there
    are none; ``HubError`` when they lie in several folders."""
    from huggingface_hub.utils import filter_repo_objects

    found: list[str] = []
    for suffix in DATA_SUFFIXES:
        if found := sorted(filter_repo_objects(names, allow_patterns=_split_patterns(ds, suffix))):
            break
    folders = sorted({_folder(ds, n) for n in found})
    if len(folders) > 1:
        shown = ", ".join(f or "." for f in folders[:6])
        raise HubError(f"{ds.spec!r}: split {ds.split!r} is in several folders of dataset {ds.repo} ({shown}); name "
                       f"one, e.g. hf:{ds.repo}/{folders[-1] or '.'}:{ds.split}")
    return found


def _no_split(ds: HubDataset) -> HubError:
    return HubError(f"{ds.spec!r}: no {' or '.join(DATA_SUFFIXES)} file of split {ds.split!r} in dataset {ds.repo}"
                    f"{' under ' + ds.path if ds.path else ''} (looked for {ds.split}.parquet, {ds.split}-*.parquet "
                    f"and {ds.split}/*.parquet at any depth, then .jsonl); name a file instead: hf:{ds.repo}/<file>")


def _folder(ds: HubDataset, name: str) -> str:
    """The folder that holds a split file (a ``<split>/`` folder counts as part of the file)."""
    parts = name.split("/")[:-1]
    if parts and parts[-1] == ds.split:
        parts = parts[:-1]
    return "/".join(parts)


def cached_dataset_files(ds: HubDataset) -> list[Path] | None:
    """The spec's files from the local cache alone (no network), or None when they are not (all) cached."""
    from huggingface_hub import snapshot_download, try_to_load_from_cache
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError

    if ds.split is None:
        found = try_to_load_from_cache(ds.repo, ds.path, repo_type="dataset", revision=ds.revision)
        return [Path(found)] if isinstance(found, str) else None
    try:
        folder = snapshot_download(ds.repo, repo_type="dataset", revision=ds.revision, local_files_only=True)
    except IncompleteSnapshotError as e:  # some file of the repository is not cached: the split's own may be
        folder = e.snapshot_path
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    root = Path(folder)
    names = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
    picked = split_files(ds, names)
    if not picked:
        return None
    try:  # the cache's own listing of the repository, where it has one, says whether a shard is missing
        snapshot_download(ds.repo, repo_type="dataset", revision=ds.revision, local_files_only=True,
                          allow_patterns=_split_patterns(ds, Path(picked[0]).suffix))
    except IncompleteSnapshotError as e:
        raise HubError(f"{ds.spec!r}: the split's files are only partly in the Hugging Face cache ({e}); "
                       f"complete it with `{ds.download_command()}`") from e
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    return [root / n for n in picked]


def download_dataset_files(ds: HubDataset) -> list[Path]:
    """The spec's files, downloaded into the cache (or found there up to date)."""
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError

    try:
        names = [ds.path] if ds.split is None else split_files(
            ds, HfApi().list_repo_files(ds.repo, repo_type="dataset", revision=ds.revision))
        if not names:
            raise _no_split(ds)
        return [Path(hf_hub_download(ds.repo, n, repo_type="dataset", revision=ds.revision)) for n in names]
    except HubError:
        raise
    except (RepositoryNotFoundError, GatedRepoError) as e:
        raise HubError(f"{ds.spec!r}: no dataset repository {ds.repo} on the Hub that this machine may read "
                       f"({type(e).__name__}; a private or gated one needs `hf auth login` or HF_TOKEN)") from e
    except EntryNotFoundError as e:
        raise HubError(f"{ds.spec!r}: dataset {ds.repo} has no file {ds.path!r}") from e
    except Exception as e:  # noqa: BLE001 - a network failure has many types (httpx, OSError, HfHubHTTPError)
        raise HubError(f"{ds.spec!r}: cannot download from the Hub ({type(e).__name__}: {e}); on a node without "
                       "internet set HF_HUB_OFFLINE=1 to read the Hugging Face cache, after downloading with "
                       f"`{ds.download_command()}` elsewhere") from e


def dataset_files(spec: str) -> list[Path]:
    """The local files of a question set ``hf:...``: from the cache when the Hub is offline (``HubError`` saying
    how to fix it when they are not there), else downloaded as needed."""
    ds = parse_dataset_spec(spec)
    var = offline_variable()
    if var is None:
        return download_dataset_files(ds)
    found = cached_dataset_files(ds)
    if found is None:
        raise HubError(f"{spec!r}: {offline_fix(var, ds.download_command())}")
    return found
