"""Job values and their lifecycle: specs, records, the coordinator's soft job table, GPU leases.

Pure: no clocks (``now`` is passed in), no I/O.  Three state holders live here:

* ``JobRecord`` -- one job (its lifecycle, the events that move it, lives in
  ``frenzyd.jobs.lifecycle``).  The submitting daemon keeps the authoritative record; records
  carry a ``schema`` number and older schemas are migrated when read (``migrate_record``).
* ``JobTable`` -- the coordinator's soft view of all jobs (rebuilt from peers' reports).
* ``LeaseTable`` -- one daemon's authority over its own GPUs: a GPU is leased to at most one
  job at a time and orders carrying a term older than the highest seen are refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from frenzyd.errors import ConfigError, JobStateError, LeaseError, WireError

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
JOB_STATES: tuple[JobState, ...] = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL: frozenset[JobState] = frozenset({"succeeded", "failed", "cancelled"})

PHASES: dict[JobState, frozenset[str]] = {
    "queued": frozenset({"waiting", "placing"}),
    "running": frozenset({"running"}),
    "succeeded": frozenset({"done"}),
    "failed": frozenset({"done"}),
    "cancelled": frozenset({"done"}),
}
"""The phases each state allows (``frenzyd.jobs.lifecycle`` explains them)."""

RECORD_SCHEMA = 2
"""Version of the job record's dict form.  1: main before attempts (no ``schema`` key, ``attempts``
counted starts).  2: ``attempt`` (the current attempt's number), ``lost``, ``phase``."""

MAX_NPROC = 1024
MAX_STEPS = 10**9
MAX_ARGV = 256
MAX_ARG_LEN = 4096
_JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def valid_job_id(job_id: str) -> bool:
    """True when ``job_id`` is safe to use as a file name and in URLs."""
    return bool(_JOB_ID_RE.match(job_id))


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What the client submits: the command, its packed directory, and what it needs.

    Either ``model`` (a MARP preset name, or ``model_config`` an HF config dict) with the
    training setup, or ``nproc`` ranks of ``mem_per_rank`` bytes each.  ``argv[0]`` is the
    script, relative to the packed directory; the ranks run ``python argv...``.
    """

    argv: tuple[str, ...]
    payload_sha256: str
    payload_size: int
    python_version: str
    torch_version: str
    name: str = ""
    model: str | None = None
    model_config: dict[str, Any] | None = None
    seq_len: int | None = None
    micro_batch: int = 1
    global_batch: int | None = None
    dtype: str = "bf16-mixed"
    optimizer: str = "adamw"
    recompute: str = "none"
    zero: int = 0
    nproc: int | None = None
    mem_per_rank: int | None = None
    steps: int | None = None
    """Declared work in optimizer steps (``--steps``): HAS runs shorter work first; None = not said."""
    trainer: bool = False
    """The ranks run the built-in trainer (``frenzyd.trainer``) instead of ``argv``, on the plan MARP
    placed; ``argv`` is empty, ``data_name`` is the data file in the payload."""
    data_name: str | None = None
    lr: float | None = None
    warmup: int | None = None
    checkpoint_every: int | None = None
    seed: int | None = None
    """Trainer options; None = the trainer's default (``frenzyd.trainer.plan.DEFAULTS``)."""
    stand_in: bool = False
    """On simulated GPUs, run a small stand-in of the model paced to MARP's step time
    (``frenzyd.jobs.rank_host.stand_in_plan``); real GPUs run the model itself."""
    checkpointable: bool = False
    """The script honours DESIGN.md §8's checkpoint contract (``run --checkpointable``): it saves
    under ``FRENZY_CHECKPOINT_DIR`` on SIGTERM and resumes from it, so it may be preempted."""

    @property
    def keeps_checkpoints(self) -> bool:
        """The job checkpoints and resumes (the built-in trainer, or a checkpointable script): the
        scheduler may stop and move it, and its checkpoint travels to its submitter."""
        return self.trainer or self.checkpointable

    def trainer_options(self) -> dict[str, Any]:
        """The options a trainer job hands its ranks in ``FRENZY_PLAN`` (None: the trainer's default)."""
        opts = {"lr": self.lr, "warmup": self.warmup, "checkpoint_every": self.checkpoint_every,
                "seed": self.seed, "dtype": self.dtype, "recompute": self.recompute,
                "optimizer": self.optimizer, "steps": self.steps}
        return {k: v for k, v in opts.items() if v is not None}

    def _validate_trainer(self) -> None:
        if self.argv:
            raise ConfigError("a built-in trainer job (--data) runs no script: drop the command after '--'")
        if self.model is None and self.model_config is None:
            raise ConfigError("a built-in trainer job needs --model CONFIG_OR_PRESET")
        if not self.data_name or "/" in self.data_name or self.data_name in (".", ".."):
            raise ConfigError("a built-in trainer job needs its data file's name (a plain file name)")
        if self.global_batch is None or self.global_batch <= 0:
            raise ConfigError("a built-in trainer job needs --global-batch G (sequences per optimizer step)")
        if self.steps is None:
            raise ConfigError("a built-in trainer job needs --steps N (optimizer steps)")
        if self.nproc is not None or self.mem_per_rank is not None or self.zero or self.micro_batch != 1:
            raise ConfigError("a built-in trainer job's plan comes from MARP: drop --nproc, --mem-per-rank, "
                              "--zero and --micro-batch")
        if self.lr is not None and not 0 < self.lr < 1:
            raise ConfigError("--lr must be in (0, 1)")
        for what, v in (("--warmup", self.warmup), ("--checkpoint-every", self.checkpoint_every),
                        ("--seed", self.seed)):
            if v is not None and v < 0:
                raise ConfigError(f"{what} must be >= 0")

    def validate(self) -> JobSpec:
        """Check the spec; raise ``ConfigError`` saying what to change.  Returns self."""
        if self.stand_in and not self.trainer:
            raise ConfigError("--stand-in is for built-in trainer jobs (--model with --data)")
        if self.checkpointable and self.trainer:
            raise ConfigError("a built-in trainer job (--data) always checkpoints: --checkpointable is for "
                              "scripts")
        if self.trainer:
            self._validate_trainer()
        elif not self.argv:
            raise ConfigError("no command: give the script after '--', e.g. 'frenzy-client run -- train.py'")
        if len(self.argv) > MAX_ARGV or any(len(a) > MAX_ARG_LEN for a in self.argv):
            raise ConfigError(f"command too long: at most {MAX_ARGV} arguments of {MAX_ARG_LEN} characters")
        if not _SHA256_RE.match(self.payload_sha256):
            raise ConfigError("payload hash must be 64 lowercase hex digits (sha256)")
        if self.payload_size < 0:
            raise ConfigError("payload size must be >= 0")
        has_model = self.model is not None or self.model_config is not None
        if has_model:
            if self.seq_len is None or self.seq_len <= 0:
                raise ConfigError("a job with --model needs --seq-len S (a positive token count)")
            if self.micro_batch <= 0:
                raise ConfigError("--micro-batch must be positive")
            if self.global_batch is not None and self.global_batch % self.micro_batch:
                raise ConfigError("--global-batch must be a multiple of --micro-batch")
        elif self.nproc is None or self.mem_per_rank is None:
            raise ConfigError(
                "a job without --model must say how many ranks and how much memory each needs: "
                "add --nproc N --mem-per-rank BYTES (e.g. --nproc 2 --mem-per-rank 2GiB)"
            )
        if self.nproc is not None and not 1 <= self.nproc <= MAX_NPROC:
            raise ConfigError(f"--nproc must be between 1 and {MAX_NPROC}")
        if self.mem_per_rank is not None and self.mem_per_rank <= 0:
            raise ConfigError("--mem-per-rank must be positive (e.g. 512MiB, 4GiB)")
        if self.zero not in (0, 1, 2, 3):
            raise ConfigError("--zero must be 0, 1, 2 or 3")
        if self.steps is not None and not 1 <= self.steps <= MAX_STEPS:
            raise ConfigError(f"--steps must be between 1 and {MAX_STEPS} (optimizer steps the job will run)")
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for the wire and the record file."""
        return {
            "argv": list(self.argv),
            "payload_sha256": self.payload_sha256,
            "payload_size": self.payload_size,
            "python_version": self.python_version,
            "torch_version": self.torch_version,
            "name": self.name,
            "model": self.model,
            "model_config": self.model_config,
            "seq_len": self.seq_len,
            "micro_batch": self.micro_batch,
            "global_batch": self.global_batch,
            "dtype": self.dtype,
            "optimizer": self.optimizer,
            "recompute": self.recompute,
            "zero": self.zero,
            "nproc": self.nproc,
            "mem_per_rank": self.mem_per_rank,
            "steps": self.steps,
        } | ({  # only trainer jobs carry these: a script job's dict (and its frames) is unchanged
            "trainer": True, "data_name": self.data_name, "lr": self.lr, "warmup": self.warmup,
            "checkpoint_every": self.checkpoint_every, "seed": self.seed,
        } if self.trainer else {}) | ({"stand_in": True} if self.stand_in else {}) | (
            {"checkpointable": True} if self.checkpointable else {})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobSpec:
        """Build and validate a spec from untrusted data; raise ``WireError`` on wrong types."""
        try:
            argv = d["argv"]
            if not isinstance(argv, list | tuple) or not all(isinstance(a, str) for a in argv):
                raise WireError("job spec: argv must be a list of strings")
            model_config = d.get("model_config")
            if model_config is not None and not isinstance(model_config, dict):
                raise WireError("job spec: model_config must be a mapping")
            spec = cls(
                argv=tuple(argv),
                payload_sha256=_typed(d, "payload_sha256", str),
                payload_size=_typed(d, "payload_size", int),
                python_version=_typed(d, "python_version", str),
                torch_version=_typed(d, "torch_version", str),
                name=_opt(d, "name", str) or "",
                model=_opt(d, "model", str),
                model_config=model_config,
                seq_len=_opt(d, "seq_len", int),
                micro_batch=_opt(d, "micro_batch", int) or 1,
                global_batch=_opt(d, "global_batch", int),
                dtype=_opt(d, "dtype", str) or "bf16-mixed",
                optimizer=_opt(d, "optimizer", str) or "adamw",
                recompute=_opt(d, "recompute", str) or "none",
                zero=_opt(d, "zero", int) or 0,
                nproc=_opt(d, "nproc", int),
                mem_per_rank=_opt(d, "mem_per_rank", int),
                steps=_opt(d, "steps", int),
                trainer=bool(_opt(d, "trainer", bool)),
                data_name=_opt(d, "data_name", str),
                lr=None if d.get("lr") is None else float(_typed_num(d, "lr")),
                warmup=_opt(d, "warmup", int),
                checkpoint_every=_opt(d, "checkpoint_every", int),
                seed=_opt(d, "seed", int),
                stand_in=bool(_opt(d, "stand_in", bool)),
                checkpointable=bool(_opt(d, "checkpointable", bool)),
            )
        except KeyError as exc:
            raise WireError(f"job spec: missing key {exc.args[0]!r}") from None
        try:
            return spec.validate()
        except ConfigError as exc:
            raise WireError(f"job spec: {exc}") from None


def _typed(d: Mapping[str, Any], key: str, typ: type) -> Any:
    v = d[key]
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise WireError(f"job spec: {key} must be {typ.__name__}")
    return v


def _typed_num(d: Mapping[str, Any], key: str) -> float:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise WireError(f"job spec: {key} must be a number")
    return float(v)


def _opt(d: Mapping[str, Any], key: str, typ: type) -> Any:
    if d.get(key) is None:
        return None
    return _typed(d, key, typ)


@dataclass(frozen=True, slots=True)
class JobPlan:
    """How a placed job runs: GPU type and count, parallel degrees, memory, and where it came from.

    The ``plan`` of the status JSON and of ``FRENZY_PLAN`` (DESIGN.md §6 plan keys).  Fields that
    a source does not know are None and left out of the dict: a declared (``--nproc``) job has no
    MARP micro-batch or step time; a mixed-type packing has no single GPU memory.
    """

    gpu_type: str
    gpus: int
    dp: int
    tp: int
    pp: int
    zero: int
    bytes_per_gpu: int
    micro_batch: int | None = None
    grad_accum: int | None = None
    gpu_memory_bytes: int | None = None
    step_time_s: float | None = None
    source: str | None = None
    """``marp`` (MARP's prediction) or ``declared`` (the user's ``--mem-per-rank``)."""
    policy: str | None = None
    """What chose it: ``frenzy`` (HAS) or ``packing (mixed GPU types)``."""
    peers: int | None = None
    backend: str | None = None
    """``nccl`` on real GPUs, ``gloo`` when any rank's GPU is simulated."""

    def to_dict(self) -> dict[str, Any]:
        """The plan dict, keys in DESIGN.md §6 order, unknown (None) fields left out."""
        d: dict[str, Any] = {
            "gpu_type": self.gpu_type, "gpus": self.gpus, "dp": self.dp, "tp": self.tp, "pp": self.pp,
            "zero": self.zero, "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
            "bytes_per_gpu": self.bytes_per_gpu, "gpu_memory_bytes": self.gpu_memory_bytes,
            "step_time_s": self.step_time_s, "source": self.source, "policy": self.policy,
            "peers": self.peers, "backend": self.backend,
        }
        return {k: v for k, v in d.items() if v is not None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobPlan:
        """Parse a plan (record file or wire); raise ``WireError`` when it is malformed."""
        if not isinstance(d, Mapping):
            raise WireError("job plan: must be a mapping")
        try:
            gpu_type = d["gpu_type"]
            if not isinstance(gpu_type, str):
                raise WireError("job plan: gpu_type must be a string")
            step = d.get("step_time_s")
            if step is not None and (not isinstance(step, int | float) or isinstance(step, bool)):
                raise WireError("job plan: step_time_s must be a number")
            return cls(
                gpu_type=gpu_type, gpus=_plan_int(d, "gpus"), dp=_plan_int(d, "dp"), tp=_plan_int(d, "tp"),
                pp=_plan_int(d, "pp"), zero=_plan_int(d, "zero"), bytes_per_gpu=_plan_int(d, "bytes_per_gpu"),
                micro_batch=_opt_plan_int(d, "micro_batch"), grad_accum=_opt_plan_int(d, "grad_accum"),
                gpu_memory_bytes=_opt_plan_int(d, "gpu_memory_bytes"),
                step_time_s=None if step is None else float(step),
                source=_opt_plan_str(d, "source"), policy=_opt_plan_str(d, "policy"),
                peers=_opt_plan_int(d, "peers"), backend=_opt_plan_str(d, "backend"),
            )
        except KeyError as exc:
            raise WireError(f"job plan: missing key {exc.args[0]!r}") from None


def _plan_int(d: Mapping[str, Any], key: str) -> int:
    v = d[key]
    if not isinstance(v, int) or isinstance(v, bool):
        raise WireError(f"job plan: {key} must be an integer")
    return v


def _opt_plan_int(d: Mapping[str, Any], key: str) -> int | None:
    return None if d.get(key) is None else _plan_int(d, key)


def _opt_plan_str(d: Mapping[str, Any], key: str) -> str | None:
    v = d.get(key)
    if v is not None and not isinstance(v, str):
        raise WireError(f"job plan: {key} must be a string")
    return v


@dataclass(frozen=True, slots=True)
class RankAssignment:
    """One rank of a placed job: which peer and which GPU (by uuid and local index) runs it."""

    rank: int
    peer: str
    peer_name: str
    gpu: str
    gpu_index: int
    local_rank: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "peer": self.peer,
            "peer_name": self.peer_name,
            "gpu": self.gpu,
            "gpu_index": self.gpu_index,
            "local_rank": self.local_rank,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RankAssignment:
        try:
            return cls(
                rank=int(d["rank"]),
                peer=str(d["peer"]),
                peer_name=str(d.get("peer_name", "")),
                gpu=str(d["gpu"]),
                gpu_index=int(d["gpu_index"]),
                local_rank=int(d["local_rank"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise WireError(f"rank assignment: {exc}") from None


@dataclass(frozen=True, slots=True)
class LateAttempt:
    """An earlier attempt whose exit codes arrived after it was requeued: its size and the codes."""

    world_size: int
    exit_codes: dict[int, int] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        return len(self.exit_codes) == self.world_size and not any(self.exit_codes.values())

    def to_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "exit_codes": {str(k): v for k, v in self.exit_codes.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LateAttempt:
        return cls(int(d["world_size"]), {int(k): int(v) for k, v in (d.get("exit_codes") or {}).items()})


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job as its submitter (authoritative) or the coordinator (soft) sees it."""

    id: str
    spec: JobSpec
    submitter: str
    submitter_name: str
    created_at: float
    state: JobState = "queued"
    updated_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    attempt: int = 0
    """Number of the current (or last) attempt; 0 before the first.  Only grows (lifecycle)."""
    lost: int = 0
    """Started attempts that were lost (ranks gone, GPUs vacated); the job fails past ``MAX_LOST``."""
    phase: str = "waiting"
    """Detail of ``state`` (``frenzyd.jobs.lifecycle.PHASES``)."""
    term: int = 0
    """Term of the coordinator that placed the current attempt (0 while queued)."""
    plan: JobPlan | None = None
    ranks: tuple[RankAssignment, ...] = ()
    exit_codes: dict[int, int] = field(default_factory=dict)
    failed_rank: int | None = None
    """The attempt's first rank to exit non-zero (None while none has)."""
    message: str = ""
    late: dict[int, LateAttempt] = field(default_factory=dict)
    """Exit codes that arrived for earlier attempts after they were requeued (a rank host that was
    cut off or frozen near the end): attempt -> what is known of it (``lifecycle.LateExits``)."""
    owner: str | None = None
    """The local user of the submitting node who submitted the job (DESIGN §8: jobs belong to
    (node, user)); None for a record from before jobs had owners, or a job submitted in-process:
    it belongs to the daemon's own user."""
    owner_uid: int | None = None
    """That user's uid on the submitting node (None with ``owner``)."""

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def peers(self) -> tuple[str, ...]:
        """The peers running this attempt's ranks, in rank order of first appearance."""
        seen: dict[str, None] = {}
        for r in self.ranks:
            seen.setdefault(r.peer, None)
        return tuple(seen)

    def summary(self) -> dict[str, Any]:
        """The job entry of the status JSON (DESIGN.md §6), plus a few extras."""
        return {
            "id": self.id,
            "name": self.spec.name,
            "state": self.state,
            "phase": self.phase,
            "reason": self.message,
            "attempt": self.attempt,
            "failed_rank": self.failed_rank,
            "submitter": self.submitter,
            "submitter_name": self.submitter_name,
            "plan": None if self.plan is None else self.plan.to_dict(),
            "ranks": [{"rank": r.rank, "peer": r.peer, "gpu": r.gpu} for r in self.ranks],
            "attempts": self.attempt,
            "term": self.term,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "updated_at": self.updated_at,
            "message": self.message,
        }

    def to_dict(self) -> dict[str, Any]:
        """Everything, for the record file and the wire."""
        return {
            "schema": RECORD_SCHEMA,
            "id": self.id,
            "spec": self.spec.to_dict(),
            "submitter": self.submitter,
            "submitter_name": self.submitter_name,
            "created_at": self.created_at,
            "state": self.state,
            "updated_at": self.updated_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "attempt": self.attempt,
            "lost": self.lost,
            "phase": self.phase,
            "term": self.term,
            "plan": None if self.plan is None else self.plan.to_dict(),
            "ranks": [r.to_dict() for r in self.ranks],
            "exit_codes": {str(k): v for k, v in self.exit_codes.items()},
            "failed_rank": self.failed_rank,
            "message": self.message,
            # only when there is news of an earlier attempt: records of every other job keep their bytes
            **({"late": {str(a): la.to_dict() for a, la in self.late.items()}} if self.late else {}),
            # only when owned: a record without an owner keeps its bytes
            **({"owner": {"user": self.owner, "uid": self.owner_uid}} if self.owner is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobRecord:
        """Parse a record (file or wire) of any known schema; raise ``WireError`` when it is malformed
        or written by a newer frenzyd."""
        d = migrate_record(d)
        try:
            state = d["state"]
            if state not in JOB_STATES:
                raise WireError(f"job record: unknown state {state!r}")
            if d["phase"] not in PHASES[state]:
                raise WireError(f"job record: phase {d['phase']!r} is not one of state {state}'s")
            job_id = str(d["id"])
            if not valid_job_id(job_id):
                raise WireError(f"job record: bad job id {job_id!r}")
            plan = None if d.get("plan") is None else JobPlan.from_dict(d["plan"])
            return cls(
                id=job_id,
                spec=JobSpec.from_dict(d["spec"]),
                submitter=str(d["submitter"]),
                submitter_name=str(d.get("submitter_name", "")),
                created_at=float(d["created_at"]),
                state=cast(JobState, state),
                updated_at=float(d.get("updated_at") or 0.0),
                started_at=None if d.get("started_at") is None else float(d["started_at"]),
                finished_at=None if d.get("finished_at") is None else float(d["finished_at"]),
                attempt=int(d["attempt"]),
                lost=int(d["lost"]),
                phase=str(d["phase"]),
                term=int(d.get("term") or 0),
                plan=plan,
                ranks=tuple(RankAssignment.from_dict(r) for r in d.get("ranks") or ()),
                exit_codes={int(k): int(v) for k, v in (d.get("exit_codes") or {}).items()},
                failed_rank=None if d.get("failed_rank") is None else int(d["failed_rank"]),
                message=str(d.get("message") or ""),
                late={int(a): LateAttempt.from_dict(la) for a, la in (d.get("late") or {}).items()},
                **_owner(d.get("owner")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise WireError(f"job record: {exc!r}") from None


def _owner(d: Any) -> dict[str, Any]:
    """``owner``/``owner_uid`` of a record's optional ``{"user": NAME, "uid": UID}``."""
    if d is None:
        return {}
    if not isinstance(d, Mapping) or not isinstance(d.get("user"), str) or not d["user"] \
            or not isinstance(d.get("uid"), int) or isinstance(d.get("uid"), bool) or d["uid"] < 0:
        raise WireError("job record: owner must be {\"user\": NAME, \"uid\": UID}")
    return {"owner": d["user"], "owner_uid": d["uid"]}


_PHASE_OF_STATE = {"queued": "waiting", "running": "running", "succeeded": "done", "failed": "done",
                   "cancelled": "done"}


def migrate_record(d: Mapping[str, Any]) -> Mapping[str, Any]:
    """The dict form of a record of any known schema, as the current schema; ``WireError`` when
    ``d`` is not a mapping or comes from a newer frenzyd (upgrade this node first)."""
    if not isinstance(d, Mapping):
        raise WireError("job record: must be a mapping")
    schema = d.get("schema", 1)
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
        raise WireError(f"job record: bad schema {schema!r}")
    if schema > RECORD_SCHEMA:
        raise WireError(f"job record: schema {schema} is newer than this frenzyd understands "
                        f"({RECORD_SCHEMA}); upgrade frenzyd on this node")
    if schema == 1:  # starts were counted in ``attempts``; each restart was a lost attempt
        out = dict(d)
        starts = out.pop("attempts", 0)
        starts = starts if isinstance(starts, int) and not isinstance(starts, bool) and starts >= 0 else 0
        out.update(schema=2, attempt=starts, lost=max(0, starts - 1),
                   phase=_PHASE_OF_STATE.get(str(out.get("state")), "waiting"))
        return out
    return d


def new_record(job_id: str, spec: JobSpec, submitter: str, submitter_name: str, now: float,
               *, owner: tuple[str, int] | None = None) -> JobRecord:
    """A fresh queued record (``owner``: the submitting user's name and uid); raises
    ``ConfigError`` for a bad id or spec."""
    if not valid_job_id(job_id):
        raise ConfigError(f"bad job id {job_id!r}: letters, digits, '.', '_' and '-' only")
    spec.validate()
    return JobRecord(job_id, spec, submitter, submitter_name, created_at=now, updated_at=now,
                     owner=None if owner is None else owner[0], owner_uid=None if owner is None else owner[1])


class JobTable:
    """The coordinator's soft job table: records by id, queue in submission order.

    Soft state: a new coordinator fills it from submitters' resubmissions and peers' lease
    reports.  Submissions are idempotent by id.
    """

    def __init__(self) -> None:
        self._jobs: dict[str, JobRecord] = {}

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def get(self, job_id: str) -> JobRecord | None:
        return self._jobs.get(job_id)

    def all(self) -> list[JobRecord]:
        return sorted(self._jobs.values(), key=lambda r: (r.created_at, r.id))

    def submit(self, rec: JobRecord) -> JobRecord:
        """Add a queued job; a known id keeps the table's record (returned)."""
        known = self._jobs.get(rec.id)
        if known is not None:
            return known
        if rec.state != "queued":
            raise JobStateError(f"job {rec.id}: only queued jobs can be submitted (is {rec.state})")
        self._jobs[rec.id] = rec
        return rec

    def adopt(self, rec: JobRecord) -> None:
        """Take a job as a peer reports it (a new coordinator rebuilding its view)."""
        known = self._jobs.get(rec.id)
        if known is None or (not known.terminal and rec.updated_at >= known.updated_at):
            self._jobs[rec.id] = rec

    def queued(self) -> list[JobRecord]:
        """Queued jobs, oldest first (FIFO order for placement; HAS may reorder)."""
        return [r for r in self.all() if r.state == "queued"]

    def running(self) -> list[JobRecord]:
        return [r for r in self.all() if r.state == "running"]

    def update(self, rec: JobRecord) -> None:
        """Store a record produced by ``transition`` for a known job."""
        if rec.id not in self._jobs:
            raise JobStateError(f"job {rec.id} is not in the table")
        self._jobs[rec.id] = rec

    def drop(self, job_id: str) -> None:
        """Forget a job (its submitter says it is over)."""
        self._jobs.pop(job_id, None)

    def forget_finished(self, keep: int) -> None:
        """Drop the oldest terminal jobs beyond ``keep`` (bounded memory)."""
        done = [r for r in self.all() if r.terminal]
        for r in done[: max(0, len(done) - keep)]:
            del self._jobs[r.id]


@dataclass(frozen=True, slots=True)
class Lease:
    """GPUs of this node promised to attempt ``attempt`` of one job by the coordinator of ``term``."""

    job_id: str
    attempt: int
    gpus: tuple[str, ...]
    term: int
    coordinator: str
    granted_at: float
    launched: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt, "gpus": list(self.gpus), "term": self.term,
                "coordinator": self.coordinator, "launched": self.launched}


class LeaseTable:
    """A daemon's authority over its own GPUs.

    Invariants: a GPU is in at most one lease; a grant or order with a term lower than the
    highest term seen is refused (a deposed coordinator cannot start anything); leases are per
    attempt ``(job_id, attempt)``, and a grant for an attempt older than one already leased here
    is refused (a late order of a superseded attempt cannot start it).
    """

    def __init__(self) -> None:
        self._leases: dict[tuple[str, int], Lease] = {}
        self.highest_term = 0

    def observe_term(self, term: int) -> None:
        """Remember a term seen elsewhere (election); orders below it are refused from now on."""
        self.highest_term = max(self.highest_term, term)

    def leases(self) -> list[Lease]:
        return sorted(self._leases.values(), key=lambda lease: (lease.job_id, lease.attempt))

    def get(self, job_id: str, attempt: int) -> Lease | None:
        return self._leases.get((job_id, attempt))

    def newest_attempt(self, job_id: str) -> int:
        """The highest attempt of ``job_id`` leased here (0: none)."""
        return max((a for j, a in self._leases if j == job_id), default=0)

    def holder(self, gpu: str) -> str | None:
        """The job holding ``gpu``, or None."""
        for lease in self._leases.values():
            if gpu in lease.gpus:
                return lease.job_id
        return None

    def leased_gpus(self) -> dict[str, str]:
        """gpu uuid -> job id, for every leased GPU."""
        return {g: lease.job_id for lease in self._leases.values() for g in lease.gpus}

    def _check_term(self, term: int) -> None:
        if term < self.highest_term:
            raise LeaseError(f"stale term {term}: this node has seen term {self.highest_term}")

    def grant(
        self, job_id: str, attempt: int, gpus: Iterable[str], *, term: int, coordinator: str, now: float,
        offerable: Iterable[str],
    ) -> Lease:
        """Lease ``gpus`` to attempt ``attempt`` of ``job_id``; raise ``LeaseError`` (stale term or
        attempt, not offered, busy).  Granting the same GPUs to the same attempt again is
        idempotent (the term is refreshed); an older attempt's lease that never launched is
        superseded."""
        gpus_t = tuple(sorted(set(gpus)))
        if not gpus_t:
            raise LeaseError("a lease needs at least one GPU")
        if attempt < 1:
            raise LeaseError(f"bad attempt number {attempt}")
        self._check_term(term)
        newest = self.newest_attempt(job_id)
        if attempt < newest:
            raise LeaseError(f"stale attempt {attempt}: job {job_id} holds a lease for attempt {newest} here")
        offer = set(offerable)
        known = self._leases.get((job_id, attempt))
        if known is not None:
            if known.gpus != gpus_t:
                raise LeaseError(f"job {job_id} attempt {attempt} already holds other GPUs here: "
                                 f"{list(known.gpus)}")
            self.highest_term = max(self.highest_term, term)
            lease = replace(known, term=term, coordinator=coordinator)
            self._leases[(job_id, attempt)] = lease
            return lease
        for key, old in list(self._leases.items()):
            if key[0] == job_id and not old.launched:
                del self._leases[key]
        missing = [g for g in gpus_t if g not in offer]
        if missing:
            raise LeaseError(f"GPU {missing[0]} is not offered (owner busy, too little free memory, unknown)")
        taken = self.leased_gpus()
        busy = [g for g in gpus_t if g in taken]
        if busy:
            raise LeaseError(f"GPU {busy[0]} is leased to job {taken[busy[0]]}")
        self.highest_term = max(self.highest_term, term)
        lease = Lease(job_id, attempt, gpus_t, term, coordinator, now)
        self._leases[(job_id, attempt)] = lease
        return lease

    def check_order(self, job_id: str, attempt: int, term: int) -> Lease:
        """Validate a launch/stop order for ``(job_id, attempt)`` at ``term``; return the lease."""
        self._check_term(term)
        lease = self._leases.get((job_id, attempt))
        if lease is None:
            raise LeaseError(f"no lease here for job {job_id} attempt {attempt}")
        if term < lease.term:
            raise LeaseError(f"stale term {term}: the lease is from term {lease.term}")
        return lease

    def mark_launched(self, job_id: str, attempt: int) -> None:
        lease = self._leases.get((job_id, attempt))
        if lease is not None:
            self._leases[(job_id, attempt)] = replace(lease, launched=True)

    def release(self, job_id: str, attempt: int) -> Lease | None:
        """Drop the attempt's lease (its ranks exited or it was cancelled); returns it if held."""
        return self._leases.pop((job_id, attempt), None)

    def expire_unlaunched(self, now: float, ttl_s: float) -> list[Lease]:
        """Release leases granted more than ``ttl_s`` ago whose launch never came."""
        stale = [lease for lease in self._leases.values()
                 if not lease.launched and now - lease.granted_at > ttl_s]
        for lease in stale:
            del self._leases[(lease.job_id, lease.attempt)]
        return stale
