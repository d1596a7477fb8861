"""Crash-safe checkpoint directories: numbered checkpoints, their manifest, and the best policy's slot.

A checkpoint is a directory ``ckpt-<step:012d>/`` holding one part file per part (e.g.
``algorithm.part``, ``replay.part``, ``learner.part``; see :mod:`.parts`) plus ``manifest.json``
with each file's size and sha256. It is written into a temporary directory, fsynced and renamed
into place, so a crash leaves either the whole checkpoint or none of it. Loading walks
back from the newest checkpoint, skipping (with a warning) any that is incomplete or
corrupt; the next save moves those aside to ``ckpt-<step>.broken``, so that they no longer
count among the ``keep`` newest. The ``best/`` slot keeps the policy of the best evaluation
the same way.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from actorlearner.checkpoint.parts import CheckpointError, PartState, read_part, write_part

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""Version of the manifest and part layout."""

MANIFEST = "manifest.json"
PART_SUFFIX = ".part"

_CKPT_RE = re.compile(r"ckpt-(\d{12,})")
_PART_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def _fsync_dir(path: Path) -> None:
    """Make a directory's entries (new files, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _checkpoint_dirs(parent: Path) -> list[tuple[int, Path]]:
    """``(number, path)`` of every ``ckpt-<n>`` directory under ``parent``, oldest first."""
    if not parent.is_dir():
        return []
    found = []
    for entry in parent.iterdir():
        match = _CKPT_RE.fullmatch(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def _write_checkpoint(final: Path, parts: Mapping[str, PartState], meta: dict[str, Any]) -> Path:
    """Write ``parts`` and a manifest into a temp dir, fsync, then rename it to ``final``."""
    for name in parts:
        if not isinstance(name, str) or not _PART_NAME_RE.fullmatch(name):
            raise ValueError(f"invalid part name {name!r}: use letters, digits, '_', '.', '-'")
    token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    temp = final.parent / f".tmp-{final.name}-{token}"
    trash = final.parent / f".trash-{final.name}-{token}"
    temp.mkdir(parents=True)
    try:
        files = {}
        for name, state in parts.items():
            filename = name + PART_SUFFIX
            size, sha256 = write_part(temp / filename, state)
            files[name] = {"file": filename, "bytes": size, "sha256": sha256}
        manifest = {"format": FORMAT_VERSION, **meta, "created_unix": time.time(), "parts": files}
        with open(temp / MANIFEST, "x", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(temp)
        if final.exists():  # Same step saved again: swap the old one out, then drop it.
            final.rename(trash)
        temp.rename(final)
        _fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        if trash.exists() and not final.exists():
            trash.rename(final)
        raise
    shutil.rmtree(trash, ignore_errors=True)
    return final


def _read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of checkpoint directory ``path``, structurally checked."""
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError("manifest.json is missing (incomplete checkpoint)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"manifest.json is unreadable: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"manifest.json has an unknown format "
                              f"{manifest.get('format') if isinstance(manifest, dict) else None!r}")
    parts = manifest.get("parts")
    if not isinstance(parts, dict):
        raise CheckpointError("manifest.json lists no parts")
    for name, info in parts.items():
        if (not _PART_NAME_RE.fullmatch(name) or not isinstance(info, dict)
                or info.get("file") != name + PART_SUFFIX
                or type(info.get("bytes")) is not int or not isinstance(info.get("sha256"), str)):
            raise CheckpointError(f"manifest.json has an invalid entry for part {name!r:.100}")
    return manifest


def _load_checkpoint(path: Path, max_bytes: int | None) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(manifest, parts) of checkpoint ``path``, every file's size and sha256 verified."""
    manifest = _read_manifest(path)
    files = manifest["parts"]
    for name, info in files.items():  # Cheap size check of every file before reading any.
        try:
            size = (path / info["file"]).stat().st_size
        except FileNotFoundError:
            raise CheckpointError(f"part file {info['file']} is missing") from None
        if size != info["bytes"]:
            raise CheckpointError(f"part file {info['file']} is {size} bytes, manifest says "
                                  f"{info['bytes']} (truncated or overwritten)")
    parts = {}
    for name, info in files.items():
        state, sha256 = read_part(path / info["file"], max_bytes)
        if sha256 != info["sha256"]:
            raise CheckpointError(f"part file {info['file']} fails its sha256 checksum")
        parts[name] = state
    return manifest, parts


class CheckpointStore:
    """Numbered checkpoints under ``directory`` (the last ``keep`` kept) and a ``best/`` slot.

    One writer per directory: temp directories left by a crash are removed on open.
    ``max_part_bytes`` optionally caps each stored tensor; by default only the file size
    bounds what is allocated, so a 1M-item replay buffer loads.
    """

    def __init__(self, directory: str | os.PathLike[str], keep: int = 3, *,
                 max_part_bytes: int | None = None) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.directory = Path(directory)
        self.best_directory = self.directory / "best"
        self.keep = keep
        self.max_part_bytes = max_part_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        self._best_score: float | None = None
        self._best_known = False
        self._unusable: list[Path] = []  # skipped by load_latest; moved aside by the next save
        for parent in (self.directory, self.best_directory):
            if parent.is_dir():
                for entry in parent.iterdir():
                    original = parent / entry.name.removeprefix(".trash-").rsplit("-", 2)[0]
                    if entry.name.startswith(".trash-") and not original.exists():
                        entry.rename(original)  # Crashed mid-swap: the old copy is all there is.
                    elif entry.name.startswith((".tmp-", ".trash-")):
                        shutil.rmtree(entry, ignore_errors=True)

    def checkpoints(self) -> list[tuple[int, Path]]:
        """``(step, path)`` of every checkpoint directory, oldest first, valid or not."""
        return _checkpoint_dirs(self.directory)

    def save(self, step: int, parts: Mapping[str, PartState]) -> Path:
        """Durably write checkpoint ``step`` (one file per part), then prune to the last ``keep``."""
        if type(step) is not int or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        path = _write_checkpoint(self.directory / f"ckpt-{step:012d}", parts, {"step": step})
        # Left in place, a broken checkpoint numbered above this one would count among the
        # newest and pruning would delete good ones instead; keep it for a look.
        for broken in self._unusable:
            if broken != path and broken.exists():
                aside = broken.with_name(broken.name + ".broken")
                shutil.rmtree(aside, ignore_errors=True)
                broken.rename(aside)
                logger.warning("moved unusable checkpoint %s aside to %s", broken, aside.name)
        self._unusable.clear()
        for _, old in self.checkpoints()[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return path

    def load(self, path: str | os.PathLike[str]) -> tuple[int, dict[str, dict[str, Any]]]:
        """``(step, parts)`` of one checkpoint directory; CheckpointError if it is unusable."""
        path = Path(path)
        manifest, parts = _load_checkpoint(path, self.max_part_bytes)
        match = _CKPT_RE.fullmatch(path.name)
        if match is None or manifest.get("step") != int(match.group(1)):
            raise CheckpointError(f"manifest step {manifest.get('step')!r} does not match {path.name}")
        return manifest["step"], parts

    def load_latest(self) -> tuple[int, dict[str, dict[str, Any]]] | None:
        """The newest usable checkpoint as ``(step, parts)``; broken ones are skipped with a warning."""
        for _, path in reversed(self.checkpoints()):
            try:
                return self.load(path)
            except (CheckpointError, OSError) as e:
                logger.warning("skipping checkpoint %s: %s", path, e)
                self._unusable.append(path)
        return None

    # -- best ------------------------------------------------------------------------------

    @property
    def best_score(self) -> float | None:
        """Score of the stored best policy, or None when there is none."""
        if not self._best_known:
            best = self.load_best()
            self._best_score = None if best is None else best[0]
            self._best_known = True
        return self._best_score

    def save_best(self, parts: Mapping[str, PartState], score: float, *, step: int | None = None) -> bool:
        """Keep ``parts`` under ``best/`` if ``score`` beats the stored best; True if it did."""
        score = float(score)
        if not math.isfinite(score):
            raise ValueError(f"score must be finite, got {score}")
        current = self.best_score
        if current is not None and score <= current:
            return False
        existing = _checkpoint_dirs(self.best_directory)
        number = existing[-1][0] + 1 if existing else 0
        self.best_directory.mkdir(exist_ok=True)
        _write_checkpoint(self.best_directory / f"ckpt-{number:012d}", parts,
                          {"score": score, "step": step})
        for _, old in existing:
            shutil.rmtree(old, ignore_errors=True)
        self._best_score, self._best_known = score, True
        return True

    def load_best(self) -> tuple[float, dict[str, dict[str, Any]]] | None:
        """``(score, parts)`` of the best policy, or None; broken ones are skipped with a warning."""
        for _, path in reversed(_checkpoint_dirs(self.best_directory)):
            try:
                manifest, parts = _load_checkpoint(path, self.max_part_bytes)
                score = manifest.get("score")
                if not isinstance(score, (int, float)) or isinstance(score, bool):
                    raise CheckpointError(f"manifest score {score!r} is not a number")
                return float(score), parts
            except (CheckpointError, OSError) as e:
                logger.warning("skipping best checkpoint %s: %s", path, e)
        return None


def read_checkpoint(path: str | os.PathLike[str]) -> tuple[Path, dict[str, dict[str, Any]]]:
    """``(checkpoint directory, parts)`` for ``path``: one checkpoint (``ckpt-*``), or the newest usable
    one in a checkpoint directory. Read only: nothing there is moved or removed, so a learner may
    be writing to it meanwhile. CheckpointError when there is none."""
    path = Path(path)
    candidates = [path] if (path / "manifest.json").exists() else [p for _, p in reversed(_checkpoint_dirs(path))]
    problems = []
    for candidate in candidates:
        try:
            return candidate, _load_checkpoint(candidate, None)[1]
        except (CheckpointError, OSError) as e:
            problems.append(f"{candidate.name}: {e}")
    raise CheckpointError(f"no usable checkpoint in {path}" + (f" ({'; '.join(problems)})" if problems else ""))
