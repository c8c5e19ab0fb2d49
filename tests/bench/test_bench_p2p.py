"""The p2p benchmark runs, with tiny sizes and iterations, and prints well-formed tables.

* the measurement loops (``_kernels``) over an in-process fake transport
  (two threads, queues): latency, bandwidth, ring, overlap and soak all
  complete and return sane numbers, and the data check catches corruption;
* the command line end to end with whatever backends exist here: commrt
  (once ``commrt.comm`` is built), OpenMPI through mpi4py, Gloo;
* a run that hangs is killed at its deadline, leaving no process behind.
"""
import importlib.util
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from commrt.bench import _kernels, _launch, _stats

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _has(mod):
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


HAVE_MPI = bool(shutil.which("mpirun")) and _has("mpi4py")
HAVE_TORCH = _has("torch")


# -- an in-process fake transport: enough for the loops --------------------------

class _Req:
    def __init__(self, fn=None):
        self.fn = fn

    def wait(self):
        if self.fn:
            self.fn()
            self.fn = None


class _FakeWorld:
    def __init__(self, n, corrupt=False):
        self.n, self.corrupt = n, corrupt
        self.q = {}
        self.lock = threading.Lock()

    def chan(self, src, dst, tag):
        with self.lock:
            return self.q.setdefault((src, dst, tag), queue.Queue())

    def ops(self, rank):
        def send(buf, dst, tag):
            data = np.array(buf, copy=True)
            if self.corrupt and data.size > 100:
                data[100] ^= 1
            self.chan(rank, dst, tag).put(data)

        def recv(buf, src, tag):
            data = self.chan(src, rank, tag).get(timeout=20)
            assert data.size == buf.size, (data.size, buf.size)
            buf[:] = data

        return _kernels.Ops(rank, self.n, send, recv,
                            lambda b, d, t: (send(b, d, t), _Req())[1],
                            lambda b, s, t: _Req(lambda: recv(b, s, t)),
                            lambda reqs: [r.wait() for r in reqs], name=f"fake {rank}")


def _run_fake(n, spec, corrupt=False):
    world = _FakeWorld(n, corrupt)
    results, errors = [None] * n, []

    def body(r):
        try:
            results[r] = _kernels.run_tasks(world.ops(r), spec)
        except BaseException as exc:       # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "fake run hung"
    return results, errors


@pytest.mark.timeout(60)
def test_kernels_on_fake_transport():
    spec = {"tasks": ["latency", "bandwidth", "overlap", "soak"], "sizes": [0, 8, 4096],
            "iters": 3, "window": 4, "overlap_bytes": 1 << 16, "compute_s": 0.005,
            "reps": 2, "messages": 300}
    results, errors = _run_fake(2, spec)
    assert not errors, errors
    r0 = results[0]
    assert set(r0["latency_us"]) == {0, 8, 4096}
    assert all(v > 0 for v in r0["latency_us"].values())
    assert r0["bw_MBps"][4096] > 0 and r0["bw_iters"][8] == 3
    assert len(r0["overlap"]) == 2 and {"comp", "comm", "both"} <= set(r0["overlap"][0])
    assert r0["soak_messages"] >= 300 and r0["soak_errors"] == []
    assert len(r0["soak_checkpoints"]) >= 3


@pytest.mark.timeout(60)
def test_ring_on_fake_transport():
    results, errors = _run_fake(4, {"tasks": ["ring"], "ring_s": 0.2})
    assert not errors, errors
    assert results[0]["ring_laps"] > 0 and results[0]["ring_us_per_hop"] > 0


@pytest.mark.timeout(60)
def test_data_check_catches_corruption():
    _, errors = _run_fake(2, {"tasks": ["latency"], "sizes": [4096], "iters": 2}, corrupt=True)
    assert errors and "wrong bytes" in str(errors[0]) and "byte 100" in str(errors[0])


def test_stats_helpers():
    assert _stats.parse_size("64K") == 65536 and _stats.parse_size("4MiB") == 4 << 20
    assert _stats.fmt_size(8) == "8 B" and _stats.fmt_size(64 << 20) == "64 MiB"
    s = _stats.Summary([3.0, 1.0, 2.0])
    assert (s.median, s.min, s.max) == (2.0, 1.0, 3.0) and s.cell() == "2.00 [1.00-3.00]"
    assert _stats.Summary([]).cell() == "n/a" and _stats.ratio(1.0, 2.0) == "0.50"
    t = _stats.table(["size", "x"], [["8 B", "1.00"]]).splitlines()
    assert len(t) == 3 and t[0].startswith("size")


# -- the command line, end to end ------------------------------------------------------

def _bench(*args, timeout=150):
    cmd = [sys.executable, "-m", "commrt.bench", "p2p", *args]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


_NUM = r"(?:[0-9.e+-]+|n/a)"
_CELL = re.compile(rf"^{_NUM}(?: \[{_NUM}-{_NUM}\])?$")


def _tables(stdout):
    """{title: (headers, rows)}: every table printed, split into cells."""
    out = {}
    blocks = stdout.split("\n\n")
    for block in blocks:
        lines = block.strip("\n").splitlines()
        if len(lines) >= 3 and set(lines[2].replace(" ", "")) == {"-"}:
            headers = re.split(r"\s{2,}", lines[1].strip())
            rows = [re.split(r"\s{2,}", ln.strip()) for ln in lines[3:]]
            out[lines[0]] = (headers, rows)
    return out


def _check_p2p_tables(stdout, sizes, expect_values):
    tables = _tables(stdout)
    titles = [t for t in tables if t.startswith(("latency", "bandwidth"))]
    assert titles, stdout
    for title in titles:
        headers, rows = tables[title]
        assert headers[0] == "size" and "ratio = commrt / peer" in title
        assert [r[0] for r in rows] == sizes, (title, rows)
        for row in rows:
            assert len(row) == len(headers), (title, row)
            for cell, head in zip(row[1:], headers[1:]):
                assert _CELL.match(cell), (title, head, cell)
        for col in expect_values:
            if col in headers:
                i = headers.index(col)
                assert all(r[i] != "n/a" for r in rows), (title, col, rows)
    return tables


def test_bench_registry_lists_p2p():
    p = subprocess.run([sys.executable, "-m", "commrt.bench"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and re.search(r"^\s+p2p\s+\S", p.stdout, re.M), p.stdout
    assert "_p2p" not in p.stdout


@pytest.mark.timeout(200)
def test_cli_commrt_quick():
    rc, out, err = _bench("--sizes", "0,8,64K,1M", "--iters", "5", "--rounds", "1",
                          "--timeout", "60", "--target-time", "0.01")
    assert rc == 0, out + err
    _check_p2p_tables(out, ["0 B", "8 B", "64 KiB", "1 MiB"], ["commrt shm", "commrt tcp"])


@pytest.mark.timeout(120)
def test_cli_commrt_world_starter():
    rc, out, err = _bench("--starter", "world", "--transports", "shm", "--sizes", "8,64K",
                          "--iters", "5", "--rounds", "1", "--timeout", "60",
                          timeout=100)
    assert rc == 0, out + err
    _check_p2p_tables(out, ["8 B", "64 KiB"], ["commrt shm"])


@pytest.mark.timeout(200)
def test_cli_commrt_overlap_ring_memory_quick():
    rc, out, err = _bench("--transports", "shm", "--overlap", "--overlap-bytes", "1M",
                          "--compute-ms", "5", "--ring", "4", "--ring-time", "0.3",
                          "--memory", "--messages", "2000", "--rounds", "1", "--timeout", "60")
    assert rc == 0, out + err
    assert "both / longer" in out and "µs per hop" in out and "RSS end MiB" in out, out
    assert "/dev/shm entries left behind: none" in out, out


@pytest.mark.timeout(200)
@pytest.mark.skipif(not (HAVE_MPI or HAVE_TORCH), reason="neither mpi4py+OpenMPI nor torch")
def test_cli_peers_quick():
    backends = (["mpi-sm", "mpi-tcp"] if HAVE_MPI else []) + (["gloo"] if HAVE_TORCH else [])
    rc, out, err = _bench("--backends", ",".join(backends), "--sizes", "8,4K,1M", "--iters", "5",
                          "--rounds", "1", "--timeout", "90", "--target-time", "0.01")
    assert rc == 0, out + err
    cols = (["OpenMPI sm (CMA)", "OpenMPI tcp"] if HAVE_MPI else []) + (
        ["Gloo (torch)"] if HAVE_TORCH else [])
    _check_p2p_tables(out, ["8 B", "4 KiB", "1 MiB"], cols)


@pytest.mark.timeout(60)
def test_run_killed_at_deadline_leaves_nothing():
    # a child that never ends, and a grandchild in its process group
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', " \
           "'import time; time.sleep(300)']); time.sleep(300)"
    t0 = time.monotonic()
    with pytest.raises(_launch.RunFailed, match="timed out after 1 s"):
        _launch.run_procs([[sys.executable, "-c", code]] * 2, [dict(os.environ)] * 2, 1.0, "t")
    assert time.monotonic() - t0 < 10
    time.sleep(0.3)
    ps = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout
    alive = [ln for ln in ps.splitlines() if "time.sleep(300)" in ln and " Z" not in ln
             and "ps -eo" not in ln]
    assert not alive, alive
