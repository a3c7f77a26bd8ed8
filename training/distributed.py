"""torchrun setup and teardown, the few collectives train.py needs (no-ops in one process), and how a job of several
processes stops together.

Stopping together. An error is either a collective outcome or one rank's own:

- rank 0's work that the others wait for (its writes, its reads of the run directory) runs through on_master: its
  result, or its error, reaches every rank by broadcast, and every rank raises that same error (marked `shared`);
  checks whose answer may differ by rank (what each node sees, how much memory it has) go through agree;
- any other error stays on the rank that raised it (a full disk under rank 0's metrics writes, a crash, one
  rank's fault): that rank records it in the job's key-value store (torchrun's agent store, or rank 0's), then
  aborts its process group and leaves (unless its process keeps the store), so a peer blocked in a collective with
  it fails at once instead of waiting out a timeout. A peer whose collective failed reads the record and stops
  with the same exit code; when there is no record, it finds the rank that died (by its pid, on the same host)
  and says so.

Either way every rank ends in leave(): the master (rank 0, or the lowest survivor when rank 0 died) prints the one
line, every rank waits at a bounded barrier kept in the store (never a collective barrier without a timeout), and
all exit with the same code."""

from __future__ import annotations

import copy
import json
import os
import pickle
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass

import torch
import torch.distributed as dist

EXIT_PEER = 5  # another process of the job died or hung (killed, out of memory, a node lost): --resume
EXIT_WAIT_S = 60.0  # how long the ranks that finished wait for the others at the end (they finish together)
FAILURE_WAIT_S = 10.0  # how long a failing job's ranks wait for one another to report before leaving
CONTACT_WAIT_S = 5.0  # a collective failed and no rank has said why: how long to wait for a record


@dataclass
class Dist:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    data_rank: int = 0  # which share of each batch this process reads: its rank, or under tensor parallelism
    data_world: int = 1  # its tensor group's index (the ranks of a group read the same data)
    local_world: int = 1  # processes of the job on this machine (they share its memory)
    store: object = None  # the job's key-value store (multi-process only): failure records, the exit barrier
    prefix: str = ""  # this job's keys in it (a relaunch of the job starts afresh)
    procs: tuple = ()  # (host, pid) of every rank, to tell whether a peer still runs
    agent_store: bool = False  # the store is torchrun's agent's (it outlives any rank), not rank 0's process'

    @property
    def is_master(self) -> bool:
        return self.rank == 0


def setup(device: str = "auto") -> Dist:
    """Read torchrun's environment; with WORLD_SIZE > 1 join the process group (nccl on GPU, gloo on CPU) and
    register this process (host, pid) in the job's store, so a peer can tell when it died."""
    cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
        use_tf32()
    d = Dist(rank, local_rank, world, dev, rank, world, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if world > 1:
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")
        d.store = dist.distributed_c10d._get_default_store()
        d.agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        d.prefix = f"normlab/{broadcast_object(uuid.uuid4().hex[:12])}/"
        procs = [None] * world
        dist.all_gather_object(procs, (socket.gethostname(), os.getpid()))
        d.procs = tuple(procs)
    return d


def use_tf32() -> None:
    """float32 matmuls and convolutions on TF32 tensor cores (10-bit mantissa inputs, float32 accumulation):
    what a float32 run on an Ampere+ GPU should use; recorded in meta.json (`tf32`). Through the API that
    torch.get_float32_matmul_precision() reads (inductor's max-autotune calls it): setting the per-backend
    fp32_precision instead makes that call raise ('mix of the legacy and new APIs')."""
    torch.set_float32_matmul_precision("high")  # TF32 matmuls
    torch.backends.cudnn.allow_tf32 = True  # TF32 convolutions


def all_reduce(t: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """Sum (or op) of t over processes, in place; identity in a single process."""
    if dist.is_initialized():
        dist.all_reduce(t, op=op)
    return t


def any_rank(flag: bool, device: torch.device) -> bool:
    """True if flag is set on any process (so that all of them stop at the same step)."""
    if not dist.is_initialized():
        return flag
    return bool(all_reduce(torch.tensor([float(flag)], device=device), dist.ReduceOp.MAX).item())


def broadcast_object(obj, src: int = 0):
    """The object of process `src`, on every process."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


# -- errors as collective outcomes -----------------------------------------------------------------------------------

def shared(e: BaseException) -> BaseException:
    """Mark e as raised on every rank at the same point: the ranks stop together, the master says it once."""
    e.shared_by_every_rank = True
    return e


def is_shared(e: BaseException) -> bool:
    return getattr(e, "shared_by_every_rank", False)


def _portable(e: BaseException) -> BaseException:
    """e itself when it pickles (to be raised again on the other ranks), else a RuntimeError saying what it was."""
    try:
        pickle.dumps(e)
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def on_master(fn, *args, **kwargs):
    """fn(*args, **kwargs) run by rank 0 alone, its outcome on every rank: its result, or its error raised on every
    rank (shared). For rank 0's work that the other ranks would otherwise wait for at their next collective
    without knowing it failed (its writes, its reads of the run directory)."""
    if not dist.is_initialized():
        return fn(*args, **kwargs)
    outcome = None
    if dist.get_rank() == 0:
        try:
            outcome = ("ok", fn(*args, **kwargs))
        except Exception as e:
            error = e
            outcome = ("error", _portable(e))
    kind, value = broadcast_object(outcome)
    if kind == "error":
        try:  # rank 0 raises its own error (its traceback is the useful one), the others rank 0's copy
            raise shared(error if dist.get_rank() == 0 else value)
        finally:
            error = value = None  # no frame of this call keeps the exception it raised (and the frames above) alive
    return value


def first_error(error: Exception | None) -> Exception | None:
    """The first rank's error (this rank's own object when it is that rank), None when no rank has one: every rank
    gets the same answer."""
    if not dist.is_initialized():
        return error
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, None if error is None else _portable(error))
    first = next((r for r, e in enumerate(errors) if e is not None), None)
    return None if first is None else error if first == dist.get_rank() else errors[first]


def agree(error: Exception | None) -> None:
    """Raise on every rank the first rank's error (shared), if any rank has one: for checks whose answer may differ
    by rank (what a node's file system holds, how much memory it has)."""
    first = first_error(error)
    if first is not None:
        raise shared(copy.copy(first))  # a fresh exception: the caller's own object never holds this traceback


# -- leaving: one line, one exit code, a bounded barrier ---------------------------------------------------------------

class _StoreLost(Exception):
    """The job's store cannot be reached (it lived in rank 0's process, which is gone)."""


def _store(d: Dist, op: str, *args):
    try:
        return getattr(d.store, op)(*args)
    except Exception as e:
        raise _StoreLost(str(e)) from None


def _first_record(d: Dist) -> dict | None:
    """The first failure a rank recorded in this job, or None."""
    key = d.prefix + "failure/1"
    return json.loads(_store(d, "get", key)) if _store(d, "check", [key]) else None


def _record(d: Dist, verdict: dict) -> None:
    """Add a failure to the job's store, for the other ranks: {rank, code, line, and the ranks found dead}."""
    seq = _store(d, "add", d.prefix + "failures", 1)
    _store(d, "set", d.prefix + f"failure/{seq}", json.dumps({**verdict, "rank": d.rank}))


def _alive(d: Dist, rank: int) -> bool | None:
    """Whether rank `rank`'s process still runs: told by its pid when it runs on this host, else None (unknown)."""
    if rank >= len(d.procs):
        return None
    host, pid = d.procs[rank]
    if host != socket.gethostname():
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # a zombie has exited
    except OSError:
        return False


def _dead(d: Dist, ranks) -> list[int]:
    return [r for r in ranks if r != d.rank and _alive(d, r) is False]


def _died_line(d: Dist, ranks: list[int]) -> str:
    who = ", ".join(f"rank {r} (pid {d.procs[r][1]} on {d.procs[r][0]})" for r in ranks)
    return (f"error: {who} died without reporting an error (killed: out of memory, kill -9, a lost node?); every "
            f"rank stopped, and the last checkpoint is intact: --resume continues from it")


def _peer_verdict(d: Dist, error_is_contact: bool) -> dict | None:
    """Why the job failed when this rank did not cause it: another rank's record, or the rank that died. None when
    nothing points elsewhere (this rank's error is its own). A collective that failed with no record yet waits
    CONTACT_WAIT_S for one (or for a peer's process to be seen gone)."""
    deadline = time.monotonic() + (CONTACT_WAIT_S if error_is_contact else 0.0)
    while True:
        record = _first_record(d)
        if record is not None and record["rank"] != d.rank:
            return record
        dead = _dead(d, range(d.world_size))
        if dead:
            return {"rank": d.rank, "code": EXIT_PEER, "line": _died_line(d, dead), "dead": dead}
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    if error_is_contact:
        return {"rank": d.rank, "code": EXIT_PEER, "line": "error: lost contact with the other processes of the job "
                "(one of them stopped without reporting an error: killed, or its node lost?); the last checkpoint "
                "is intact: --resume continues from it"}
    return None


def looks_like_lost_contact(e: BaseException) -> bool:
    """A collective or store operation that failed because a peer is gone (gloo: 'Connection closed by peer'), as
    itself or inside another error's message (DCP wraps it)."""
    text = str(e).lower()
    return isinstance(e, getattr(dist, "DistError", ())) or any(s in text for s in (
        "connection closed by peer", "connection reset by peer", "gloo/transport", "nccl error", "broken pipe"))


def _barrier(d: Dist, name: str, wait_s: float, failing: bool) -> dict | None:
    """Every rank reaches `name`: set this rank's key, wait until all have (or, failing, all the live ones). A
    failure recorded meanwhile, a peer that died or the deadline ends the wait early, with the verdict. Then the
    rank whose process keeps the store (rank 0 without torchrun's agent) waits for the others to be done with it."""
    _store(d, "set", d.prefix + f"{name}/{d.rank}", "1")
    arrived = _store(d, "add", d.prefix + name, 1)
    deadline, next_look = time.monotonic() + wait_s, 0.0
    while arrived < d.world_size:
        if not failing:
            record = _first_record(d)
            if record is not None:
                return record
        now = time.monotonic()
        if now >= next_look:  # who is missing, and are they alive (cheap on one host; a look a second)
            next_look = now + 1.0
            missing = [r for r in range(d.world_size) if not _store(d, "check", [d.prefix + f"{name}/{r}"])]
            dead = _dead(d, missing)
            if failing and len(dead) == len(missing):
                break
            if dead and not failing:
                return {"rank": d.rank, "code": EXIT_PEER, "line": _died_line(d, dead), "dead": dead}
            if now >= deadline:
                if failing:
                    break
                late = [r for r in missing if r not in dead]
                return {"rank": d.rank, "code": EXIT_PEER, "line": f"error: {', '.join(f'rank {r}' for r in late)} "
                        f"did not reach the end of the run within {wait_s:.0f} s of the others (hung?); leaving "
                        f"without {'it' if len(late) == 1 else 'them'}"}
        time.sleep(0.02)
        arrived = _store(d, "add", d.prefix + name, 0)
    _store(d, "set", d.prefix + f"{name}-done/{d.rank}", "1")  # this rank's last use of the store
    if d.rank == 0 and not d.agent_store:  # leaving now would take the store from a rank still polling it
        waiting, deadline = set(range(1, d.world_size)), time.monotonic() + 5.0
        while waiting and time.monotonic() < deadline:
            waiting = {r for r in waiting if _alive(d, r) is not False
                       and not _store(d, "check", [d.prefix + f"{name}-done/{r}"])}
            time.sleep(0.01)
    return None


def _say(line: str | None) -> None:
    if line:
        print(line, file=sys.stderr, flush=True)


def _as_seen_by(record: dict, own_line: str | None) -> str:
    """A record's line as the master prints it: naming the rank it happened on, unless the master had it too."""
    line = record["line"]
    if record["rank"] == 0 or line == own_line or record.get("dead") is not None:
        return line
    head, sep, rest = line.partition("error: ")
    return f"{head}error: rank {record['rank']}: {rest}" if sep and not head else f"rank {record['rank']}: {line}"


def leave(d: Dist, code: int, line: str | None, shared_outcome: bool, lost_contact: bool = False) -> int:
    """The end of a process: print the one line (the master), meet the other ranks at a bounded barrier, leave the
    process group; the exit code, the same on every rank.

    shared_outcome: every rank reached the same outcome at the same point (a finished run, or an error raised on
    every rank by on_master / agree). Otherwise the error (code, line) happened on this rank alone, or a collective
    failed under it (lost_contact: a peer is gone; see the module docstring)."""
    if d.world_size == 1 or d.store is None:
        _say(line)
        return code
    for s in (signal.SIGINT, signal.SIGTERM):  # torchrun stops the others as soon as one exits: report first
        signal.signal(s, signal.SIG_IGN)
    if not d.agent_store and d.rank != 0 and _rank0_gone(d, lost_contact):  # the store died with rank 0's process
        return _store_lost(d)
    try:
        if shared_outcome:
            if d.is_master:
                _say(line)
            verdict = _barrier(d, "end", EXIT_WAIT_S, failing=False)
            if verdict is None:
                dist.destroy_process_group()
                return code
        else:
            verdict = _peer_verdict(d, lost_contact)
            if verdict is None:  # this rank's own error: say so in the store before the others stop on it
                verdict = {"rank": d.rank, "code": code, "line": line or f"error: exit code {code}"}
        if verdict["rank"] == d.rank:  # found or raised here: the others read it from the store
            _record(d, verdict)
        verdict = _first_record(d) or verdict
        _abort()
        dead = verdict.get("dead") or _dead(d, [0])
        printer = min(r for r in range(d.world_size) if r not in dead or r == d.rank)
        # one line for the job: the printer is the lowest live rank, and a rank that finds the one that printed
        # already gone (it left first) would otherwise print the line a second time
        if d.rank == printer and not (shared_outcome and verdict["line"] == line) \
                and _store(d, "add", d.prefix + "said", 1) == 1:
            _say(_as_seen_by(verdict, line))
        # the store may live in this process (rank 0 without torchrun's agent): let the others read it. Any other
        # rank leaves at once: a peer blocked in a collective with it is freed only by its exit, since gloo's abort
        # leaves the connections open while DDP / FSDP / a device mesh hold the group (measured: 10 s sooner)
        keeps_store = d.rank == 0 and not d.agent_store
        _barrier(d, "left", FAILURE_WAIT_S if keeps_store else 0.0, failing=True)
        return verdict["code"]
    except _StoreLost:
        return _store_lost(d)


def _rank0_gone(d: Dist, lost_contact: bool) -> bool:
    """Whether rank 0 (which keeps the store when there is no torchrun agent) has exited. A peer's connections close
    a moment before its process is seen gone: after a lost contact, look for half a second before touching the
    store (whose client would print a C++ warning and retry for seconds)."""
    deadline = time.monotonic() + (0.5 if lost_contact else 0.0)
    while _alive(d, 0) is not False:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _store_lost(d: Dist) -> int:
    """The store lived in rank 0's process (no torchrun agent), and it is gone: rank 0 died; the lowest rank left
    says so."""
    _abort()
    dead = _dead(d, range(d.world_size))
    if d.rank == min((r for r in range(d.world_size) if r not in dead), default=d.rank):
        _say(_died_line(d, dead or [0]) if dead else "error: rank 0 died without reporting an error (the job's "
             "store, kept by its process, is gone); the last checkpoint is intact: --resume continues from it")
    return EXIT_PEER


def _abort() -> None:
    """Leave the process group at once, so that a peer blocked in a collective with this rank fails rather than
    waiting out the group's timeout. On gloo that happens when the connections close: at the abort when nothing
    else holds the group (within 0.01 s, measured), else when this process exits (DDP, FSDP and device meshes
    hold it)."""
    if dist.is_initialized():
        try:
            dist.distributed_c10d._abort_process_group()
        except Exception:
            pass


def teardown() -> None:
    """Leave the process group together (for scripts that run under torchrun without train.py's leave()): a
    bounded barrier in the store (a rank that destroys its group while another still works could abort at exit in
    gloo, 'terminate called without an active exception', measured), then destroy it."""
    if not dist.is_initialized():
        return
    try:
        d = Dist(dist.get_rank(), 0, dist.get_world_size(), store=dist.distributed_c10d._get_default_store(),
                 prefix="normlab/teardown/")
        if _barrier(d, "end", EXIT_WAIT_S, failing=False) is None:
            dist.destroy_process_group()
            return
    except _StoreLost:
        pass
    _abort()
