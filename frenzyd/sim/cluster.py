"""Cluster descriptions for the simulator: the TOML format of DESIGN.md §6 and Alibaba's GPU node list.

Both parsers take the file's text (the CLI reads the file) and return a
:class:`~frenzyd.has.interface.Cluster` value.  The Alibaba list
(``cluster-trace-gpu-v2023``, Weng et al., ATC 2023) maps ``V100M16`` →
``V100-16GB``, ``V100M32`` → ``V100-32GB`` and keeps ``P100``, ``T4``, ``A10``;
the undisclosed ``G2``/``G3`` nodes are left out (no stated memory or speed).
"""

from __future__ import annotations

import csv
import io
import math
import random
import tomllib
from collections.abc import Mapping

from frenzyd.errors import ConfigError
from frenzyd.gpu_types import GIB, GPU_TYPES
from frenzyd.has.interface import Cluster, Gpu, GpuTypeSpec

ALIBABA_TYPE_MAP: dict[str, str] = {
    "V100M16": "V100-16GB",
    "V100M32": "V100-32GB",
    "P100": "P100",
    "T4": "T4",
    "A10": "A10",
}
ALIBABA_UNDISCLOSED = frozenset({"G1", "G2", "G3"})


def build_cluster(nodes: list[tuple[str, dict[str, int]]], types: Mapping[str, GpuTypeSpec]) -> Cluster:
    """A Cluster from (node name, {type: count}) pairs; every type must be in ``types``."""
    gpus: list[Gpu] = []
    seen: set[str] = set()
    for name, counts in nodes:
        if name in seen:
            raise ConfigError(f"node name {name!r} appears twice in the cluster: names must be unique")
        seen.add(name)
        index = 0
        for t, n in sorted(counts.items()):
            if t not in types:
                raise ConfigError(f"node {name!r} has GPUs of unknown type {t!r}: add a [types.{t}] table")
            for _ in range(n):
                gpus.append(Gpu(name, index, t))
                index += 1
    if not gpus:
        raise ConfigError("the cluster has no GPUs: add [[nodes]] with gpus = {TYPE = count}")
    used = sorted({g.gpu_type for g in gpus})
    return Cluster(types=tuple(types[t] for t in used), gpus=tuple(sorted(gpus)))


def _canonical_spec(name: str) -> GpuTypeSpec | None:
    info = GPU_TYPES.get(name)
    return GpuTypeSpec(name, info.memory_bytes, info.speed) if info else None


def parse_cluster_toml(text: str) -> Cluster:
    """Parse the TOML cluster format: ``[types.NAME]`` (memory_gib, speed) and ``[[nodes]]`` (name, gpus)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"cluster file is not valid TOML: {exc}") from exc
    types: dict[str, GpuTypeSpec] = {}
    raw_types = doc.get("types", {})
    if not isinstance(raw_types, dict):
        raise ConfigError("[types] must be a table of [types.NAME] tables")
    for name, body in raw_types.items():
        if not isinstance(body, dict):
            raise ConfigError(f"[types.{name}] must be a table with memory_gib and speed")
        base = _canonical_spec(name)
        mem = body.get("memory_gib")
        speed = body.get("speed")
        if mem is None and base is None:
            raise ConfigError(f"[types.{name}] needs memory_gib (not a canonical type name)")
        if speed is None and base is None:
            raise ConfigError(f"[types.{name}] needs speed (V100 = 1.0; not a canonical type name)")
        try:
            mem_b = int(float(mem) * GIB) if mem is not None else base.memory_bytes  # type: ignore[union-attr]
            spd = float(speed) if speed is not None else base.speed  # type: ignore[union-attr]
        except (TypeError, ValueError, OverflowError) as exc:  # Overflow: memory_gib = inf
            raise ConfigError(f"[types.{name}] memory_gib and speed must be finite numbers") from exc
        if mem_b <= 0 or not 0 < spd < math.inf:
            raise ConfigError(f"[types.{name}] memory_gib and speed must be positive and finite")
        types[name] = GpuTypeSpec(name, mem_b, spd)
    raw_nodes = doc.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ConfigError("the cluster file needs [[nodes]] entries with name and gpus = {TYPE = count}")
    nodes: list[tuple[str, dict[str, int]]] = []
    for i, node in enumerate(raw_nodes):
        if not isinstance(node, dict) or not isinstance(node.get("name"), str):
            raise ConfigError(f"[[nodes]] entry {i + 1} needs a name")
        counts = node.get("gpus")
        if not isinstance(counts, dict):
            raise ConfigError(f"node {node['name']!r} needs gpus = {{TYPE = count}}")
        parsed: dict[str, int] = {}
        for t, n in counts.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ConfigError(f"node {node['name']!r}: count of {t} must be a non-negative integer")
            if t not in types:
                spec = _canonical_spec(t)
                if spec is None:
                    raise ConfigError(f"node {node['name']!r}: unknown GPU type {t!r}; add [types.{t}]")
                types[t] = spec
            if n:
                parsed[t] = n
        nodes.append((node["name"], parsed))
    return build_cluster(nodes, types)


def parse_alibaba_csv(text: str, *, include_undisclosed: bool = False) -> list[tuple[str, dict[str, int]]]:
    """Nodes of Alibaba's GPU node list (columns sn, cpu_milli, memory_mib, gpu, model) as (name, counts).

    G1–G3 are undisclosed hardware and are left out; asking for them raises.
    """
    if include_undisclosed:
        raise ConfigError("Alibaba's G1-G3 GPUs are undisclosed hardware: no memory or speed to assume")
    reader = csv.DictReader(io.StringIO(text))
    need = {"sn", "gpu", "model"}
    if reader.fieldnames is None or not need <= set(reader.fieldnames):
        raise ConfigError("not an Alibaba GPU node list: expected columns sn, gpu, model")
    nodes: list[tuple[str, dict[str, int]]] = []
    for row in reader:
        model = (row.get("model") or "").strip()
        if model in ALIBABA_UNDISCLOSED:
            continue
        t = ALIBABA_TYPE_MAP.get(model)
        if t is None:
            raise ConfigError(f"Alibaba node {row.get('sn')!r}: unknown GPU model {model!r}")
        try:
            n = int(row["gpu"])
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"Alibaba node {row.get('sn')!r}: gpu count {row.get('gpu')!r}") from exc
        if n > 0:
            nodes.append((row["sn"], {t: n}))
    return nodes


def sample_nodes(
    nodes: list[tuple[str, dict[str, int]]], target_gpus: int, seed: int
) -> list[tuple[str, dict[str, int]]]:
    """A seeded subsample of whole nodes with about ``target_gpus`` GPUs and the real type mix.

    Each type gets a quota proportional to its share of all GPUs (rounded,
    types whose quota rounds to 0 are left out); nodes of that type are drawn
    in seeded random order and kept while they fit the quota.
    """
    per_type: dict[str, list[tuple[str, dict[str, int]]]] = {}
    total = 0
    for name, counts in nodes:
        t = next(iter(counts))
        per_type.setdefault(t, []).append((name, counts))
        total += sum(counts.values())
    rng = random.Random(seed)
    chosen: list[tuple[str, dict[str, int]]] = []
    for t in sorted(per_type):
        have = sum(sum(c.values()) for _, c in per_type[t])
        quota = round(target_gpus * have / total)
        pool = sorted(per_type[t])
        rng.shuffle(pool)
        got = 0
        for name, counts in pool:
            n = sum(counts.values())
            if got + n <= quota:
                chosen.append((name, counts))
                got += n
            if got == quota:
                break
    return sorted(chosen)


def alibaba_cluster(text: str, *, target_gpus: int | None = 64, seed: int = 0) -> Cluster:
    """The Alibaba node list as a Cluster; ``target_gpus`` samples a slice (None = every disclosed node)."""
    nodes = parse_alibaba_csv(text)
    if target_gpus is not None:
        nodes = sample_nodes(nodes, target_gpus, seed)
    types = {t: s for t in ALIBABA_TYPE_MAP.values() if (s := _canonical_spec(t)) is not None}
    return build_cluster(nodes, types)
