r"""A calibrator on disk: ``config.json`` + ``weights.safetensors`` in one directory, never pickle.

``config.json`` holds ``format_version`` (1), ``name`` (the registry name), ``config`` (the
hyper-parameters), ``dim_in`` and ``fit_stats``; ``weights.safetensors`` holds the arrays of
:meth:`~flowsearch.calibration.base.Calibrator.state`. Indexes carry such a directory (their
``calibrator/``), so the format stays readable by every later release.

Loading (:func:`flowsearch.calibration.loader.load`) checks everything before using anything: a
directory that is not a whole, consistent calibrator raises one :class:`~flowsearch.errors.NotFound`
(a missing directory or file) or :class:`~flowsearch.errors.BadInput` (``param="calibrator"``:
malformed content) naming the file, what is wrong and the fix. A caller that read the directory from
an index, not from the user, re-raises the latter as :class:`~flowsearch.errors.IndexDamaged`.

Example:
    >>> import tempfile
    >>> from flowsearch.calibration import make_calibrator
    >>> cal = make_calibrator("sn").fit(np.random.default_rng(0).normal(size=(20, 3)))
    >>> folder = tempfile.mkdtemp()
    >>> save(cal, folder)
    >>> sorted(p.name for p in Path(folder).iterdir())
    ['config.json', 'weights.safetensors']
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import ClassVar, Protocol, TypeGuard, cast

import numpy as np

# typing.NotRequired is 3.11+, and typing.TypedDict of 3.10 ignores it
from typing_extensions import NotRequired, TypedDict

from flowsearch.atomic import atomic_write
from flowsearch.errors import BadInput, NotFound
from flowsearch.jsonable import JSONObject


class Saveable(Protocol):
    """What :func:`save` reads of a calibrator (:class:`~flowsearch.calibration.base.Calibrator`,
    which imports this module, so it is not named here)."""

    name: ClassVar[str]

    @property
    def config(self) -> Mapping[str, object]: ...

    @property
    def fit_stats(self) -> JSONObject: ...

    def _need_fitted(self) -> int: ...

    def state(self) -> dict[str, np.ndarray]: ...


__all__ = [
    "CONFIG_FILE",
    "FORMAT_VERSION",
    "WEIGHTS_FILE",
    "malformed",
    "read_config",
    "read_weights",
    "require_files",
    "save",
]

#: The version of the on-disk form this code writes and the newest it reads.
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.safetensors"

# The fix for a malformed calibrator directory, as each surface spells it.
_FIX = "fit the calibrator and save it again, or pass another {calibrator} directory"
_FIX_CLI = "pass another --calibrator directory (e.g. an index's calibrators/c000001 folder)"


def malformed(file: Path, problem: str) -> BadInput:
    return BadInput(f"{file}: {problem}", fix=_FIX, param="calibrator", cli=_FIX_CLI)


def save(cal: Saveable, directory: str | os.PathLike[str]) -> None:
    """Writes ``cal`` (a fitted :class:`~flowsearch.calibration.base.Calibrator`) into
    ``directory``: the weights first, then the config, each replaced atomically.

    Raises:
        BadInput: ``cal`` is not fitted.
    """
    from safetensors.numpy import save_file

    dim_in = cal._need_fitted()
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    meta = {
        "format_version": FORMAT_VERSION,
        "name": cal.name,
        "config": cal.config,
        "dim_in": dim_in,
        "fit_stats": cal.fit_stats,
    }
    tensors = {k: np.ascontiguousarray(v) for k, v in cal.state().items()}
    atomic_write(path / WEIGHTS_FILE, lambda tmp: save_file(tensors, tmp))
    atomic_write(
        path / CONFIG_FILE,
        lambda tmp: Path(tmp).write_text(json.dumps(meta, indent=2, sort_keys=True)),
    )


def require_files(path: Path, cfg_path: Path, weights_path: Path, *, stored: bool = False) -> None:
    """Both files there, nothing else: anything beside them (a pickle, a torch.save file) is
    refused rather than ignored, so that no one is led to think it was used (and none of it is
    ever unpickled). ``stored``: a calibrator an index holds, whose files its manifest names:
    anything else there is a stray (``info --verify`` lists it, the next write removes it),
    ignored here."""
    for required, what in ((path, "no such directory"), (cfg_path, f"{CONFIG_FILE} missing"),
                           (weights_path, f"{WEIGHTS_FILE} missing")):  # fmt: skip
        if not (required.is_dir() if required is path else required.is_file()):
            raise NotFound(
                f"no saved calibrator at {path} ({what})",
                fix="pass a directory written by Calibrator.save (e.g. an index's "
                "calibrators/c000001 folder)",
                param="calibrator",
                cli=_FIX_CLI,
            )
    for item in sorted(path.iterdir()) if not stored else ():
        if item.name in (CONFIG_FILE, WEIGHTS_FILE) or item.name.startswith("."):
            continue  # .NAME.tmp-*: an interrupted atomic save
        raise BadInput(
            f"unexpected file {item.name!r} in the calibrator directory {path}; a calibrator "
            f"is {CONFIG_FILE} + {WEIGHTS_FILE} only (never pickle)",
            fix="remove the file or save the calibrator again",
            param="calibrator",
        )


class SavedConfig(TypedDict):
    """``config.json``'s checked content."""

    format_version: int
    name: str
    dim_in: int
    config: JSONObject
    fit_stats: NotRequired[JSONObject]


def read_config(cfg_path: Path) -> SavedConfig:
    """The checked content of ``config.json``."""
    try:
        meta = json.loads(cfg_path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise malformed(cfg_path, f"unreadable or not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise malformed(cfg_path, f"holds {type(meta).__name__}, not a JSON object")
    version = meta.get("format_version")
    if not _is_int(version):
        raise malformed(cfg_path, f"'format_version' is {version!r}, not an integer")
    if version > FORMAT_VERSION:
        raise BadInput(
            f"{cfg_path}: format version {version} is newer than this flowsearch reads "
            f"({FORMAT_VERSION})",
            fix="upgrade flowsearch",
            param="calibrator",
        )
    checks: tuple[tuple[str, str, Callable[[object], bool]], ...] = (
        ("name", "a string", lambda v: isinstance(v, str)),
        ("dim_in", "a positive integer", lambda v: _is_int(v) and v > 0),
        ("config", "a JSON object", lambda v: isinstance(v, dict)),
        ("fit_stats", "a JSON object", lambda v: isinstance(v, dict)),
    )
    for key, kind, ok in checks:
        if key not in meta and key != "fit_stats":  # fit_stats: informative only
            raise malformed(cfg_path, f"key {key!r} is missing")
        if key in meta and not ok(meta[key]):
            raise malformed(cfg_path, f"{key!r} is {meta[key]!r}, not {kind}")
    return cast(SavedConfig, meta)


def read_weights(weights_path: Path) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(str(weights_path))
    except (OSError, ValueError, TypeError, SafetensorError) as exc:
        raise malformed(weights_path, f"unreadable ({exc})") from None


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
