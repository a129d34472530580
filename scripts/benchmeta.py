"""Provenance and the results-JSON writer shared by every benchmark (``scripts/bench_*.py``).

Each benchmark takes ``provenance()`` when it starts and hands it, with its
results document, to ``write_results()``.  Every results file therefore starts
with the same four keys (``PROVENANCE_KEYS``):

``command``
    ``[sys.executable, *sys.argv]``.
``git_commit``
    ``HEAD`` of the checkout the script lives in, ``"<sha>-dirty"`` when
    ``git status --porcelain`` lists anything, ``"unknown"`` outside git.
``machine``
    ``platform``, ``python``, ``processor``, ``cpu`` (model name from
    ``/proc/cpuinfo``), ``cpus``, ``memory_total_bytes`` (``/proc/meminfo``)
    and ``torch``; the last three only where they can be read.  torch is never
    imported for this: its version comes from the loaded module or from the
    installed distribution's metadata.
``time``
    when the provenance was taken (the run's start), UTC ISO-8601
    (``2026-11-30T22:07:00Z``).

The scripts find this module because Python puts ``scripts/`` first on
``sys.path`` when it runs ``python scripts/bench_x.py``; each script also adds
its own directory, so importing one from elsewhere (a test) works too.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

PROVENANCE_KEYS = ("command", "git_commit", "machine", "time")


def git_commit(root: Path = ROOT) -> str:
    """``<sha>`` of ``root``'s checkout, ``<sha>-dirty`` with uncommitted changes, ``unknown`` outside git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def _proc_field(path: str, name: str) -> str | None:
    with contextlib.suppress(OSError):
        for line in Path(path).read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == name:
                return value.strip()
    return None


def _torch_version() -> str | None:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(getattr(torch, "__version__", None), str):
        return str(torch.__version__)
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """What the numbers were measured on (see the module docstring for the fields)."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
    }
    cpu = _proc_field("/proc/cpuinfo", "model name")
    if cpu:
        info["cpu"] = cpu
    info["cpus"] = os.cpu_count()
    mem = _proc_field("/proc/meminfo", "MemTotal")  # "24576000 kB"
    if mem:
        with contextlib.suppress(ValueError, IndexError):
            number, *unit = mem.split()
            info["memory_total_bytes"] = int(number) * (1024 if unit == ["kB"] else 1)
    torch = _torch_version()
    if torch:
        info["torch"] = torch
    return info


def provenance(root: Path = ROOT) -> dict[str, Any]:
    """The ``PROVENANCE_KEYS`` of a results document, taken now."""
    return {
        "command": [sys.executable, *sys.argv],
        "git_commit": git_commit(root),
        "machine": machine(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_results(path: Path, doc: dict[str, Any], prov: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``prov`` (default: ``provenance()`` now) followed by ``doc`` to ``path`` as JSON.

    The parent directory is created; the file is indented by 2 and ends with a
    newline.  ``doc`` must not carry provenance keys of its own.  Returns the
    document written.
    """
    clash = sorted(set(doc) & set(PROVENANCE_KEYS))
    if clash:
        raise ValueError(f"results document already has provenance keys {clash}")
    full = {**(provenance() if prov is None else prov), **doc}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(full, indent=2) + "\n")
    return full
