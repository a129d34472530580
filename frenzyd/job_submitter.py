"""The submitter role: a node's own jobs -- records, payloads, output, results, (re)submission."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from frenzyd.errors import FrenzyError, JobStateError, LaunchError, WireError
from frenzyd.jobs import (
    JobRecord,
    JobSpec,
    new_record,
    record_exits,
    transition,
)
from frenzyd.orch_common import (
    CHUNK,
    RESUBMIT_S,
    SEND_TIMEOUT_S,
    ClusterView,
    RoleBase,
    own_codes,
    slug,
)

log = logging.getLogger(__name__)


class SubmitterRole(RoleBase):
    """Keeps the authoritative records of the jobs submitted on this node."""

    async def submit(self, request: Mapping[str, Any]) -> JobRecord:
        """Pack ``request['workdir']``, persist a queued job and hand it to the coordinator.

        ``request`` carries the JobSpec fields except payload hash/size and versions.
        Raises ``ConfigError``/``LaunchError`` with a message for the user.
        """
        workdir = Path(str(request.get("workdir") or ""))
        if not workdir.is_absolute() or not await asyncio.to_thread(workdir.is_dir):
            raise JobStateError(f"job directory {workdir} is not an absolute path to a directory")
        payload, sha = await asyncio.to_thread(self._pack_dir, workdir, self.max_payload_bytes)
        fields = {k: v for k, v in request.items() if k != "workdir"}
        fields.update(payload_sha256=sha, payload_size=len(payload), python_version=self.versions.python,
                      torch_version=self.versions.torch)
        try:
            spec = JobSpec.from_dict(fields)
        except WireError as exc:
            raise JobStateError(str(exc).removeprefix("job spec: ")) from None
        now = self.clock()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
        job_id = f"{slug(self.node_name)}-{stamp}-{secrets.token_hex(2)}"
        rec = new_record(job_id, spec, self.node_id, self.node_name, now)
        await asyncio.to_thread(self.store.create, rec, payload)
        log.info("job %s queued (%s)", job_id, " ".join(spec.argv))
        self.wake()
        return rec

    async def cancel(self, job_id: str) -> JobRecord:
        """Cancel a job submitted here: queued ones at once, running ones through the coordinator."""
        rec = self.store.get(job_id)
        if rec.terminal:
            return rec
        v = self._view()
        if rec.state == "running" or (v.coordinator is not None and rec.id in self._acked):
            if v.coordinator is None:
                raise JobStateError("no coordinator right now: the cancel cannot reach the ranks; "
                                    "retry shortly")
            self._cancelling.add(job_id)  # exits of the killed ranks now mean "cancelled"
            try:
                await self._send(v.coordinator, "job.cancel", {"job_id": job_id}, SEND_TIMEOUT_S)
            except FrenzyError:
                self._cancelling.discard(job_id)
                raise
        rec = self.store.get(job_id)
        if not rec.terminal:
            rec = transition(rec, "cancelled", now=self.clock(), message="cancelled by user")
            self.store.save(rec)
        return rec

    async def _submitter_tick(self, v: ClusterView) -> None:
        now = self.clock()
        for stored in self.store.all():
            rec = stored
            if rec.terminal:
                continue
            if rec.state == "running" and now - (rec.started_at or now) > 5 * self.heartbeat_s + 10:
                lost = [p for p in rec.peers() if not self._peer_has_job(v, p, rec.id)
                        and not self._peer_exited(rec, p)]
                if lost:
                    rec = transition(rec, "queued", now=now, message=f"lost ranks on peer {lost[0][:12]}")
                    self.store.save(rec)
                    self._acked.pop(rec.id, None)
                    log.warning("job %s: %s; requeued", rec.id, rec.message)
            acked = self._acked.get(rec.id) == (v.coordinator, v.term)
            if v.coordinator is None or (acked and now < self._resend_at.get(rec.id, 0)):
                continue
            self._resend_at[rec.id] = now + RESUBMIT_S
            try:
                reply = await self._send(v.coordinator, "job.submit", {"record": rec.to_dict()},
                                         SEND_TIMEOUT_S)
            except FrenzyError as exc:
                log.info("job %s: coordinator unreachable (%s); will retry", rec.id, exc)
                continue
            if reply.get("ok"):
                self._acked[rec.id] = (v.coordinator, v.term)

    @staticmethod
    def _peer_has_job(v: ClusterView, peer: str, job_id: str) -> bool:
        rep = v.peers.get(peer)
        if rep is None:
            return False
        return any(isinstance(x, Mapping) and x.get("job_id") == job_id for x in rep.get("leases") or ())

    @staticmethod
    def _peer_exited(rec: JobRecord, peer: str) -> bool:
        return all(r.rank in rec.exit_codes for r in rec.ranks if r.peer == peer)

    def _apply_placement(self, rec: JobRecord, body: Mapping[str, Any]) -> JobRecord:
        """Submitter: adopt the coordinator's placement carried in a state or exit message."""
        theirs = JobRecord.from_dict(body)
        if rec.state == "running" and theirs.state == "running" and theirs.attempts > rec.attempts:
            rec = transition(rec, "queued", now=self.clock(), message="placed again by the coordinator")
        if rec.state == "queued" and theirs.state == "running" and theirs.attempts > rec.attempts:
            rec = transition(rec, "running", now=self.clock(), plan=theirs.plan, ranks=theirs.ranks,
                             term=theirs.term, message="placed")
            self.store.save(rec)
            log.info("job %s running on %d rank(s), term %d", rec.id, rec.world_size, rec.term)
        return rec

    async def _h_state(self, peer: str, body: dict[str, Any]) -> dict[str, Any]:
        theirs = JobRecord.from_dict(body["record"])
        rec = self.store.get(theirs.id)
        if rec.terminal:
            return {"ok": True, "state": rec.state}
        if theirs.state == "running":
            rec = self._apply_placement(rec, body["record"])
        elif theirs.state == "failed" and rec.state == "queued":
            rec = transition(rec, "failed", now=self.clock(), message=theirs.message)
            self.store.save(rec)
        elif theirs.state == "queued" and rec.state == "running" and theirs.term == 0:
            rec = transition(rec, "queued", now=self.clock(), message=theirs.message)
            self.store.save(rec)
            self._acked.pop(rec.id, None)
        return {"ok": True, "state": rec.state}

    async def _h_output(self, peer: str, body: dict[str, Any]) -> dict[str, Any]:
        rec = self.store.get(body["job_id"])
        now = self.clock()
        for ch in body["chunks"]:
            if (isinstance(ch, list) and len(ch) == 3 and isinstance(ch[0], int) and isinstance(ch[1], str)
                    and isinstance(ch[2], bytes)):
                self.store.append_output(rec.id, ch[0], ch[1][:16], ch[2], now)
        return {"ok": True}

    async def _h_results(self, peer: str, body: dict[str, Any]) -> dict[str, Any]:
        job_id, off, total, data = body["job_id"], body["offset"], body["total"], body["data"]
        self.store.get(job_id)
        if total > self.max_result_bytes or off < 0:
            raise LaunchError(f"results of {total} bytes exceed the cap of {self.max_result_bytes}")
        buf = self._results_buf.setdefault(job_id, bytearray())
        if off != len(buf):
            buf.clear()
            if off != 0:
                raise LaunchError("results arrived out of order")
        buf.extend(data)
        if len(buf) >= total:
            await asyncio.to_thread(self.store.write_results, job_id, bytes(buf))
            del self._results_buf[job_id]
        return {"ok": True}

    def _submitter_exit(self, peer: str, body: dict[str, Any], raw: dict[int, int]) -> None:
        job_id = body["job_id"]
        mine = self.store.find(job_id)
        if mine is not None and not mine.terminal:
            if "record" in body:
                mine = self._apply_placement(mine, body["record"])
            # A peer reports only the ranks it was given.
            codes = own_codes(raw, mine, peer)
            if mine.term == body["term"] and mine.state == "running" and body.get("vacated"):
                why = str(body.get("reason") or "it stopped")
                rec = transition(mine, "queued", now=self.clock(),
                                 message=f"vacated by peer {peer[:12]}: {why}")
                self.store.save(rec)
                self._acked.pop(rec.id, None)
                log.warning("job %s: %s; requeued", rec.id, rec.message)
            elif mine.term == body["term"]:
                rec = record_exits(mine, codes, now=self.clock())
                if rec.state == "failed" and rec.id in self._cancelling:
                    rec = replace(rec, state="cancelled", message="cancelled by user")
                if rec != mine:
                    self.store.save(rec)
                if rec.terminal:
                    log.info("job %s %s: %s", rec.id, rec.state, rec.message)
                    self._spawn(self._announce_finished(rec), f"finished {rec.id}")

    async def _h_payload(self, peer: str, body: dict[str, Any]) -> dict[str, Any]:
        length = max(0, min(int(body["length"]), CHUNK))
        data, total = await asyncio.to_thread(self.store.payload, body["job_id"], int(body["offset"]), length)
        return {"ok": True, "data": data, "total": total}

    async def _announce_finished(self, rec: JobRecord) -> None:
        for peer in rec.peers():
            with contextlib.suppress(FrenzyError):
                await self._send(peer, "job.finished", {"job_id": rec.id}, SEND_TIMEOUT_S)
