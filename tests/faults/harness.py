"""Run a fault job under commrt-launch and read back what every rank and the launcher saw.

    job = run_job(tmp_path, n=4, transport="tcp", fault="kill", culprit=2, seed=7)
    job.records[r]      what rank r saw (fault_rank.py's record), None if it never reported
    job.fault           the culprit's note, written just before its fault
    job.returncode, job.stderr, job.summary   the launcher's exit code, stderr, summary lines

Every job leaves nothing behind: no rank process, no commrt name in /dev/shm,
no commrt file or directory in /tmp (checked by ``assert_nothing_left``).
"""
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from commrt import config

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_PROGRAM = os.path.join(HERE, "fault_rank.py")
LAUNCH = [sys.executable, "-m", "commrt.launcher"]
# The liveness tests here run with COMMRT_LIVENESS_TIMEOUT_S scaled down from its
# default (8 s) to keep the suite short (tests/transport/test_liveness.py holds
# the default bound); a stopped rank or a cut link is named within NAMED_WITHIN_S
# (that bound plus a loaded host).
LIVENESS_S = 3
LIVENESS = {"COMMRT_LIVENESS_TIMEOUT_S": str(LIVENESS_S)}
NAMED_WITHIN_S = 8.0
# Every random choice of the campaign derives from this seed (COMMRT_FAULT_SEED, or a
# fresh one printed in pytest's header): the tests' draws and hypothesis's cases.
SEED = config.get("COMMRT_FAULT_SEED")
if SEED is None:
    import random

    SEED = random.SystemRandom().randrange(1 << 31)
_STRIPPED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def clean_env(**extra):
    """This environment without any launcher's variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if k not in _STRIPPED and not k.startswith(("COMMRT_", "OMPI_", "PMIX_", "SLURM_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH", "")) if p)
    env.update({k: str(v) for k, v in extra.items()})
    return env


@dataclass
class Job:
    returncode: int
    stderr: str
    stdout: str
    records: Dict[int, Optional[dict]]
    fault: Optional[dict]
    wall: float
    summary: List[str] = field(default_factory=list)

    def survivors(self, culprit):
        return {r: rec for r, rec in self.records.items() if r != culprit}

    def detection(self, culprit):
        """Seconds from the fault to each survivor's error (same host clock)."""
        t0 = self.fault["t"]
        return {r: rec["t"] - t0 for r, rec in self.survivors(culprit).items()
                if rec and rec.get("t")}

    def describe(self):
        lines = [f"launcher exit {self.returncode} after {self.wall:.1f} s", "summary:"]
        lines += ["  " + s for s in self.summary]
        lines.append(f"fault: {self.fault}")
        for r, rec in sorted(self.records.items()):
            if rec is None:
                lines.append(f"rank {r}: no report")
            else:
                lines.append(f"rank {r}: {rec.get('status')} {rec.get('exc')} named="
                             f"{rec.get('named')} op={rec.get('op')} {rec.get('coll')}: "
                             f"{(rec.get('message') or '')[:300]}")
        lines.append("stderr tail:\n" + "\n".join(self.stderr.splitlines()[-30:]))
        for pid, text in sorted(getattr(self, "stacks", {}).items()):
            lines.append(f"pid {pid} at the launcher's SIGTERM:\n{text[-3000:]}")
        return "\n".join(lines)


TRANSPORTS = ("shm", "tcp")


def draw(rng, fault):
    """World size, culprit and fault point of one test."""
    n = rng.randint(2, 8)
    where = "timer" if fault in ("kill", "stop") and rng.random() < 0.5 else "call"
    at = round(rng.uniform(0.05, 1.0), 3) if where == "timer" else rng.randint(1, 300)
    return n, rng.randrange(n), where, at


def rank_args(results, seed, culprit=-1, fault="none", where="call", at=1, sleep=0.0,
              ops=10 ** 6, max_seconds=120.0):
    return [RANK_PROGRAM, "--results", str(results), "--seed", str(seed), "--culprit",
            str(culprit), "--fault", fault, "--where", where, "--at", str(at), "--sleep",
            str(sleep), "--ops", str(ops), "--max-seconds", str(max_seconds),
            "--ready", os.path.join(str(results), "ready")]


def run_job(workdir, n, transport, *, seed, culprit=-1, fault="none", where="call", at=1,
            sleep=0.0, ops=10 ** 6, timeout=60.0, grace=30.0, env=None, launcher_args=(),
            prefix=(), max_seconds=None, when_ready=None):
    """Run one job of fault_rank.py to its end; the Job.  when_ready(results dir), if
    given, runs once every rank has begun its stream (e.g. to cut a link)."""
    results = os.path.join(str(workdir), f"results-{fault}-{n}-{transport}-{seed}")
    os.makedirs(results, exist_ok=True)
    env = clean_env(COMMRT_TRANSPORT=transport, **(env or {}))
    argv = list(prefix) + LAUNCH + ["-n", str(n), "--grace", str(grace), "--timeout",
                                    str(timeout), *launcher_args]
    argv += rank_args(results, seed, culprit, fault, where, at, sleep, ops,
                      max_seconds if max_seconds is not None else timeout)
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        if when_ready is not None:
            _wait_ready(results, n, proc, start + timeout)
            when_ready(results)
        stdout, stderr = proc.communicate(timeout=timeout + grace + 30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    wall = time.monotonic() - start
    records = {}
    for r in range(n):
        path = os.path.join(results, f"rank{r}.json")
        records[r] = json.load(open(path)) if os.path.exists(path) else None
    fpath = os.path.join(results, "fault.json")
    fault_note = json.load(open(fpath)) if os.path.exists(fpath) else None
    summary = [line[len("commrt-launch: "):] for line in stderr.splitlines()
               if line.startswith("commrt-launch: ")]
    job = Job(proc.returncode, stderr, stdout, records, fault_note, wall, summary)
    job.stacks = _stacks_of_stragglers(results, records)
    pids = [rec["pid"] for rec in records.values() if rec]
    if fault_note and fault_note.get("pid"):
        pids.append(fault_note["pid"])
    assert_gone(pids, job)
    return job


def _stacks_of_stragglers(results, records):
    """Thread stacks of the ranks that had not reported when the launcher sent
    SIGTERM (fault_rank.py dumps them then): {pid: text}."""
    reported = {rec["pid"] for rec in records.values() if rec}
    out = {}
    for name in os.listdir(results):
        if name.startswith("stacks."):
            pid = int(name.split(".")[1])
            text = open(os.path.join(results, name)).read()
            if text.strip() and pid not in reported:
                out[pid] = text
    return out


def _wait_ready(results, n, proc, deadline):
    while time.monotonic() < deadline:
        if all(os.path.exists(os.path.join(results, f"ready.{r}")) for r in range(n)):
            return
        if proc.poll() is not None:
            raise AssertionError(f"the job ended (exit {proc.returncode}) before every rank "
                                 f"was ready:\n{proc.stderr.read()[-3000:]}")
        time.sleep(0.02)
    raise AssertionError("the ranks were not all ready before the deadline")


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def assert_gone(pids, job, within=5.0):
    end = time.monotonic() + within
    while time.monotonic() < end and any(alive(p) for p in pids):
        time.sleep(0.05)
    left = [p for p in pids if alive(p)]
    assert not left, f"rank processes {left} outlived the job\n{job.describe()}"


# -- what is left on the host ----------------------------------------------------------

def host_leftovers():
    """commrt's names in /dev/shm and /tmp (a job must leave none behind)."""
    found = set()
    for d in ("/dev/shm", "/tmp"):
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            continue
        found |= {os.path.join(d, x) for x in names if x.lower().startswith("commrt")}
    return found


def assert_culprit_named(job, culprit, *, classes, within):
    """Every survivor raised one of `classes` (by name, anywhere in its MRO) naming
    `culprit`, within `within` seconds of the fault; the launcher's exit code and
    summary name the culprit."""
    info = job.describe()
    assert job.fault is not None and job.fault["rank"] == culprit, info
    for r, rec in job.survivors(culprit).items():
        assert rec is not None, f"rank {r} never reported (hung, or killed first)\n{info}"
        assert rec["status"] == "error", f"rank {r} saw no error\n{info}"
        assert any(c in rec["mro"] for c in classes), \
            f"rank {r} raised {rec['exc']}, not one of {classes}\n{info}"
        assert rec["named"] == culprit, f"rank {r} blamed rank {rec['named']}, not {culprit}\n{info}"
    late = {r: round(t, 2) for r, t in job.detection(culprit).items() if t > within}
    assert not late, f"ranks named the culprit later than {within} s: {late}\n{info}"
    assert job.returncode not in (0, 124), info
    assert job.summary and re.match(rf"rank {culprit} \(pid \d+ ", job.summary[0]), \
        f"the launcher's summary does not name rank {culprit} first\n{info}"


def assert_no_leak_in_survivors(job, culprit):
    """Each survivor closed its communicator after the fault with as many
    descriptors and threads as before init."""
    for r, rec in job.survivors(culprit).items():
        if rec is None:
            continue
        assert rec["after"]["fds"] <= rec["before"]["fds"], \
            f"rank {r} holds {rec['after']['fds'] - rec['before']['fds']} more descriptors " \
            f"after close than before init\n{job.describe()}"
        assert rec["after"]["threads"] <= rec["before"]["threads"], \
            f"rank {r} has {rec['after']['threads']} threads after close, " \
            f"{rec['before']['threads']} before init\n{job.describe()}"
