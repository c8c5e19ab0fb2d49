"""A link cut in the middle of a stream of collectives, between two network namespaces.

Host A (a namespace) runs the launcher and N-1 ranks, host B one rank, the
culprit; they talk TCP over a veth pair.  Once every rank is inside its
stream, the test drops every packet both ways on the veth pair (a tc
``blackhole`` qdisc on each end; a link merely set down leaves TCP
retransmitting for many minutes).  No process dies and no socket closes:
only liveness can tell.  Every rank on A must name the rank on B, that rank
must fail too, within the liveness bound, and the launcher's exit code and
summary name it.

Namespaces are named cmrt-<pid>-<n>-a/b, made and removed by this test only
(also when it fails); nothing else on the host is touched.
"""
import itertools
import json
import os
import shutil
import subprocess
import time

import pytest

from harness import LIVENESS, NAMED_WITHIN_S, assert_culprit_named, run_job

pytestmark = pytest.mark.netns  # tests/conftest.py: such tests run one at a time

_count = itertools.count()


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


def _usable():
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        return "network namespaces and tc need root, iproute2 and tc"
    probe = f"cmrt-{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
        subprocess.run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root",
                        "blackhole"], check=True, capture_output=True, timeout=20)
        return None
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"cannot drop packets with a tc blackhole qdisc here: {exc}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=20)


@pytest.fixture
def two_hosts():
    """Namespaces A and B joined by a veth pair; yields (a, b, a_ip, dev_a, dev_b)."""
    why = _usable()
    if why:
        pytest.skip(why)
    n = next(_count)
    a, b = f"cmrt-{os.getpid()}-{n}-a", f"cmrt-{os.getpid()}-{n}-b"
    dev_a, dev_b = f"cm{os.getpid() % 10 ** 7}{n}a", f"cm{os.getpid() % 10 ** 7}{n}b"
    net = f"10.252.{(os.getpid() * 7 + n) % 250}"
    made = []
    try:
        for ns in (a, b):
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("link", "add", dev_a, "netns", a, "type", "veth", "peer", "name", dev_b, "netns", b)
        for ns, dev, addr in ((a, dev_a, f"{net}.1"), (b, dev_b, f"{net}.2")):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield a, b, f"{net}.1", dev_a, dev_b
    finally:
        for ns in made:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                                  timeout=20).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


@pytest.mark.timeout(200)
def test_a_cut_link_is_named_within_the_liveness_bound(two_hosts, rng, seed, tmp_path,
                                                      private_tmp, figure):
    a, b, a_ip, dev_a, dev_b = two_hosts
    n = rng.randint(2, 5)
    culprit = n - 1                       # the one rank on B (ranks fill hosts in order)
    delay = rng.uniform(0.05, 1.0)

    def cut(results):
        time.sleep(delay)
        t = time.time()
        for ns, dev in ((b, dev_b), (a, dev_a)):
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root",
                            "blackhole"], check=True, capture_output=True, timeout=20)
        with open(os.path.join(results, "fault.json"), "w") as f:
            json.dump({"rank": culprit, "pid": None, "fault": "cut", "t": t}, f)

    job = run_job(tmp_path, n, "auto", seed=seed, timeout=90,
                  env={"COMMRT_TIMEOUT": "60", **LIVENESS},
                  prefix=["ip", "netns", "exec", a],
                  launcher_args=["--hosts", f"{a}:{n - 1},{b}:1", "--ssh-cmd", "ip netns exec",
                                 "--bind", a_ip],
                  when_ready=cut)
    info = job.describe()
    seen = {r: round(rec["t"] - job.fault["t"], 2) for r, rec in job.records.items()
            if rec and rec.get("t")}
    print(f"link cut N={n}, rank {culprit} alone on B: detected after {seen} s")
    figure("link cut", transport="tcp", n=n, detected=seen)
    assert all(rec["transport"][str(culprit)] == "tcp"
               for r, rec in job.records.items() if rec and r != culprit), info
    assert_culprit_named(job, culprit, classes=("TransportError", "AbortedError"),
                         within=NAMED_WITHIN_S)
    rec = job.records[culprit]
    assert rec is not None and rec["status"] == "error", f"rank {culprit} saw nothing\n{info}"
    assert "CommTimeoutError" not in rec["mro"], info
    assert rec["t"] - job.fault["t"] < NAMED_WITHIN_S, info
