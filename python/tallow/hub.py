"""Models by Hugging Face Hub name, downloaded with ``huggingface_hub`` into its cache.

A Hub name (see :func:`parse`) is one of:

- ``user/repo:QUANT``: the GGUF of the repo whose quantization is QUANT, compared without regard
  to case: a file whose name ends in ``-QUANT`` or ``.QUANT`` before ``.gguf`` (and before a
  split model's ``-00001-of-00003``), or a file in a folder named QUANT;
- ``user/repo``: the file llama.cpp picks: Q4_K_M, else Q8_0, else the first GGUF;
- ``hf://user/repo/path/file.gguf``: that file (``hf://user/repo:QUANT`` works too).

GGUFs that are not models (projectors, importance matrices: ``mmproj``, ``imatrix`` in the name)
are never picked. A model split into parts (``name-00001-of-00003.gguf``, ...) is downloaded
whole and loaded from its first part.

Downloads go through ``huggingface_hub``: its cache (``HF_HOME``, ``HF_HUB_CACHE``), progress
bars, resumption of dropped connections, ``HF_TOKEN`` (or ``hf auth login``) for gated and
private repos, ``HF_ENDPOINT`` for a mirror and ``HF_HUB_OFFLINE=1`` to use only the cache. A
file just downloaded is checked against the sha256 the Hub lists for it. When the Hub cannot be
reached, the newest snapshot of the repo in the cache is used.

``huggingface_hub`` is imported only by the functions that talk to the Hub or read its cache, so
that telling a Hub name from a path costs no import.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tallow.catalog import _log, sha256_file
from tallow.errors import CatalogError, InvalidArgumentError, ModelNotFoundError, TallowError

if TYPE_CHECKING:
    from huggingface_hub import CachedRevisionInfo
    from huggingface_hub.errors import HfHubHTTPError

__all__ = ["CachedGguf", "HubName", "cached_ggufs", "parse", "pull", "select_file"]

_REPO = r"\w[\w.-]*/\w[\w.-]*"
_NAME = re.compile(rf"(?P<repo>{_REPO})(?::(?P<tag>[\w.-]+))?")
_FILE = re.compile(rf"(?P<repo>{_REPO})/(?P<file>.+\.gguf)", re.IGNORECASE)
# The names llama.cpp's gguf-split gives the parts of a model.
_SPLIT = re.compile(r"(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf")
# The quantization at the end of a file's name: "-Q4_K_M" or ".q4_k_m".
_QUANT = re.compile(r"[-.](?P<quant>\w+)$")
# Words in the names of GGUFs that sit beside models but are not models themselves.
_NOT_MODELS = ("mmproj", "imatrix")
# What a name without a tag picks first, in order (as llama.cpp); else the first model.
_DEFAULT_TAGS = ("Q4_K_M", "Q8_0")


@dataclass(frozen=True)
class HubName:
    """A model named by its repo on the Hugging Face Hub."""

    repo: str
    """``user/repo``."""
    tag: str | None = None
    """The quantization asked for (``"Q4_K_M"``), or None for the default choice."""
    file: str | None = None
    """The exact file asked for (from ``hf://user/repo/path/file.gguf``)."""


@dataclass(frozen=True)
class CachedGguf:
    """A GGUF model in ``huggingface_hub``'s cache."""

    repo: str
    file: str
    """Its path in the repo (the first part, for a split model)."""
    size: int
    """Bytes, of all its parts."""
    parts: int
    """1, or the number of files of a split model."""


@dataclass(frozen=True)
class _Snapshot:
    """The files of a repo at one commit: each file's path, and the sha256 the Hub lists for it
    (None where it lists none, or where the listing comes from the cache)."""

    commit: str
    files: Mapping[str, str | None]


def parse(text: str) -> HubName | None:
    """The Hub name that ``text`` spells (see the module's documentation), or None if it is not
    one: a name that ends in ``.gguf``, or with anything but one ``/`` between word characters,
    dots and dashes, is a path. Raises :class:`InvalidArgumentError` for a malformed ``hf://``
    name."""
    if text.startswith("hf://"):
        rest = text.removeprefix("hf://")
        exact = _FILE.fullmatch(rest)
        if exact is not None:
            return HubName(exact["repo"], file=exact["file"])
        named = _NAME.fullmatch(rest)
        if named is None:
            raise InvalidArgumentError(
                f"{text!r} is not a Hub name: write hf://user/repo, hf://user/repo:QUANT "
                "or hf://user/repo/path/file.gguf"
            )
        return HubName(named["repo"], named["tag"])
    if text.lower().endswith(".gguf"):
        return None
    named = _NAME.fullmatch(text)
    return HubName(named["repo"], named["tag"]) if named is not None else None


def select_file(name: HubName, files: Iterable[str]) -> str:
    """The file of the repo's ``files`` (paths in the repo) that ``name`` picks: the first part,
    for a split model. Raises :class:`ModelNotFoundError` when none fits, listing what there
    is."""
    files = sorted(files)
    models = [path for path in files if _is_model(path)]
    if name.file is not None:
        if name.file not in files:
            raise ModelNotFoundError(
                f"no file {name.file} in {name.repo}; its GGUF models: "
                f"{', '.join(models) or 'none'}"
            )
        return _split_parts(name.file)[0]
    if not models:
        raise ModelNotFoundError(f"{name.repo} holds no GGUF model")
    for tag in (name.tag,) if name.tag is not None else _DEFAULT_TAGS:
        matching = [path for path in models if _matches(path, tag)]
        if matching:
            return matching[0]
    if name.tag is None:
        return models[0]
    quants = ", ".join(sorted({_quant(path) for path in models}))
    raise ModelNotFoundError(f"no {name.tag} file in {name.repo}; there are: {quants}")


def pull(name: str, *, progress: bool = True, force: bool = False) -> Path:
    """Download the model that Hub name ``name`` picks (every part, for a split model) into
    ``huggingface_hub``'s cache, unless it is there, and return the path of its file (of its
    first part, for a split model).

    The repo's files are listed at its newest commit (one request), and each file is downloaded
    at that commit; a file just downloaded is checked against the sha256 the Hub lists for it,
    and removed from the cache if it does not match. ``progress`` shows status lines and
    ``huggingface_hub``'s progress bars on stderr; ``force`` downloads again what is cached.

    Raises :class:`ModelNotFoundError` for a repo, tag or file that does not exist, and
    :class:`CatalogError` when the Hub refuses access (a gated or private repo: set ``HF_TOKEN``)
    or a download fails or is damaged.
    """
    hub_name = parse(name)
    if hub_name is None:
        raise InvalidArgumentError(
            f"{name!r} is not a Hub name: write user/repo, user/repo:QUANT or "
            "hf://user/repo/path/file.gguf"
        )
    snapshot = _snapshot(hub_name.repo, progress)
    parts = _split_parts(select_file(hub_name, snapshot.files))
    missing = [part for part in parts if part not in snapshot.files]
    if missing:
        raise ModelNotFoundError(
            f"{hub_name.repo} lacks {', '.join(missing)} of the split model {parts[0]}"
        )
    with _progress_bars(progress):
        paths = [_download(hub_name.repo, snapshot, part, force=force) for part in parts]
    _log(progress, f"{name} is ready: {paths[0]}")
    return paths[0]


def cached_ggufs() -> list[CachedGguf]:
    """The GGUF models in ``huggingface_hub``'s cache, by repo and file (split models whose
    parts are all there, once, by their first part)."""
    found: dict[tuple[str, str], CachedGguf] = {}
    for repo, revision in _cached_revisions():
        sizes = _snapshot_files(revision)
        for path in filter(_is_model, sizes):
            parts = _split_parts(path)
            if all(part in sizes for part in parts):
                size = sum(sizes[part] for part in parts)
                found[repo, path] = CachedGguf(repo, path, size, len(parts))
    return sorted(found.values(), key=lambda gguf: (gguf.repo, gguf.file))


# -- file names ---------------------------------------------------------------------------------


def _stem(path: str) -> str:
    """A GGUF's file name without ``.gguf`` and a split model's part number."""
    name = path.rsplit("/", 1)[-1]
    split = _SPLIT.fullmatch(name)
    return split["prefix"] if split is not None else name[: -len(".gguf")]


def _is_model(path: str) -> bool:
    """Whether ``path`` is a GGUF model that can be loaded by itself: not a projector or an
    importance matrix, nor a split model's part other than the first."""
    name = path.rsplit("/", 1)[-1]
    if not name.lower().endswith(".gguf") or any(word in name.lower() for word in _NOT_MODELS):
        return False
    split = _SPLIT.fullmatch(name)
    return split is None or int(split["no"]) == 1


def _matches(path: str, tag: str) -> bool:
    """Whether the file ``path`` is of quantization ``tag`` (see the module's documentation)."""
    tag = tag.lower()
    stem = _stem(path).lower()
    folders = path.lower().split("/")[:-1]
    return stem == tag or stem.endswith((f"-{tag}", f".{tag}")) or tag in folders


def _quant(path: str) -> str:
    """The quantization a file's name (or else its folder) gives, as a tag would name it."""
    match = _QUANT.search(_stem(path))
    if match is not None:
        return match["quant"].upper()
    folders = path.split("/")[:-1]
    return folders[-1] if folders else _stem(path)


def _split_parts(path: str) -> list[str]:
    """The files of the model of which ``path`` is a file: itself, or every part of a split
    model, in order."""
    folder, slash, name = path.rpartition("/")
    split = _SPLIT.fullmatch(name)
    if split is None:
        return [path]
    count = int(split["count"])
    prefix = f"{folder}{slash}{split['prefix']}"
    return [f"{prefix}-{no:05d}-of-{count:05d}.gguf" for no in range(1, count + 1)]


# -- the Hub and the cache ----------------------------------------------------------------------


def _snapshot(repo: str, progress: bool) -> _Snapshot:
    """The files of ``repo`` at its newest commit, as the Hub lists them; those of its newest
    snapshot in the cache when the Hub cannot be reached."""
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    try:
        info = HfApi().model_info(repo, files_metadata=True)
    except HfHubHTTPError as exc:
        raise _hub_error(exc, repo) from None
    except (httpx2.TransportError, OfflineModeIsEnabled) as exc:
        cached = _cached_snapshot(repo)
        if cached is None:
            raise CatalogError(
                f"cannot reach the Hub ({exc}), and {repo} is not in the cache"
            ) from None
        _log(progress, f"cannot reach the Hub ({exc}); using the cached files of {repo}")
        return cached
    if info.sha is None:
        raise CatalogError(f"the Hub did not give the commit of {repo}")
    files = {s.rfilename: s.lfs.sha256 if s.lfs else None for s in info.siblings or []}
    return _Snapshot(info.sha, files)


def _download(repo: str, snapshot: _Snapshot, path: str, *, force: bool) -> Path:
    """The local path of file ``path`` of ``repo`` at the snapshot's commit, downloaded into
    the cache unless it is there (or ``force``), and checked against the Hub's sha256 if it
    was downloaded."""
    import httpx2
    from huggingface_hub import hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    cached = isinstance(try_to_load_from_cache(repo, path, revision=snapshot.commit), str)
    try:
        local = Path(hf_hub_download(repo, path, revision=snapshot.commit, force_download=force))
    except HfHubHTTPError as exc:
        raise _hub_error(exc, repo) from None
    except LocalEntryNotFoundError:
        raise CatalogError(
            f"cannot reach the Hub to download {path} of {repo}, and it is not in the cache"
        ) from None
    except (OSError, httpx2.TransportError) as exc:
        raise CatalogError(f"cannot download {path} of {repo}: {exc}") from None
    expected = snapshot.files[path]
    if expected is not None and (force or not cached):
        _verify(local, expected, f"{repo}/{path}")
    return local


def _verify(path: Path, expected: str, what: str) -> None:
    """Check the sha256 of a file just downloaded; a damaged one leaves the cache (its snapshot
    link and its blob), so that the next pull downloads it again."""
    actual = sha256_file(path)
    if actual != expected:
        blob = path.resolve()
        path.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
        raise CatalogError(
            f"{what}: sha256 mismatch: expected {expected} (listed by the Hub), got {actual}; "
            "the damaged download was removed from the cache"
        )


def _hub_error(exc: HfHubHTTPError, repo: str) -> TallowError:
    """The error to raise for the Hub's refusal ``exc`` of a request about ``repo``."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    login = "set HF_TOKEN to an access token of your account, or log in with `hf auth login`"
    if isinstance(exc, GatedRepoError):
        return CatalogError(
            f"{repo} is a gated repo: accept its conditions on its page of the Hub, then {login}"
        )
    if isinstance(exc, RepositoryNotFoundError):
        return ModelNotFoundError(f"no model {repo} on the Hub (if it is private: {login})")
    status = exc.response.status_code
    if status in (401, 403):
        return CatalogError(f"the Hub refused access to {repo} (HTTP {status}): {login}")
    summary = str(exc).strip().splitlines()[0]
    return CatalogError(f"the Hub failed a request about {repo}: {summary}")


@contextlib.contextmanager
def _progress_bars(shown: bool) -> Iterator[None]:
    """``huggingface_hub``'s progress bars, on or off for the block."""
    from huggingface_hub.utils.tqdm import disable_progress_bars

    with contextlib.nullcontext() if shown else disable_progress_bars():
        yield


def _cached_revisions() -> Iterator[tuple[str, CachedRevisionInfo]]:
    """``(repo, snapshot)`` of each snapshot of a model repo in ``huggingface_hub``'s cache."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        cache = scan_cache_dir()
    except CacheNotFound:
        return
    for repo in cache.repos:
        if repo.repo_type == "model":
            for revision in repo.revisions:
                yield repo.repo_id, revision


def _snapshot_files(revision: CachedRevisionInfo) -> dict[str, int]:
    """Each file of a cached snapshot: its path in the repo, and its size."""
    return {
        file.file_path.relative_to(revision.snapshot_path).as_posix(): file.size_on_disk
        for file in revision.files
    }


def _cached_snapshot(repo: str) -> _Snapshot | None:
    """The newest snapshot of ``repo`` in the cache (the one ``main`` points at, if any)."""
    revisions = [revision for name, revision in _cached_revisions() if name == repo]
    if not revisions:
        return None
    newest = max(revisions, key=lambda r: ("main" in r.refs, r.last_modified))
    return _Snapshot(newest.commit_hash, dict.fromkeys(_snapshot_files(newest)))
