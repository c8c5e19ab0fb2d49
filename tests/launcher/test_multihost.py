"""Ranks on other hosts, started through --ssh-cmd: first with a stand-in for
ssh that runs the command here, then for real across two network namespaces
joined by a veth pair (addresses exist only inside the namespaces)."""
import os
import shutil
import subprocess

import pytest

from launch_helpers import LAUNCH, assert_no_orphans, clean_env, launch, wait_for

pytestmark = pytest.mark.netns  # tests/conftest.py: such tests run one at a time

# "ssh HOST CMD..." that runs CMD here: drops the host name and execs the rest
FAKE_SSH = "sh -c 'shift; exec \"$@\"' fake-ssh"

RING = """
    import numpy as np
    import commrt
    comm = commrt.init()
    record_pid()
    r, n = comm.rank, comm.size
    out, got = np.full(1000, r, dtype=np.int64), np.empty(1000, dtype=np.int64)
    if r % 2 == 0:
        comm.send(out, (r + 1) % n)
        comm.recv(got, (r - 1) % n)
    else:
        comm.recv(got, (r - 1) % n)
        comm.send(out, (r + 1) % n)
    assert (got == (r - 1) % n).all()
    print("ring ok", r, n, os.environ["COMMRT_HOST_ID"], os.environ["COMMRT_LOCAL_RANK"])
    comm.close()
    """


def test_remote_ranks_through_a_stand_in_ssh(script):
    prog = script("""
        record_pid()
        os.fstat(int(os.environ["COMMRT_SECRET_FD"]))   # the secret's inherited descriptor
        assert "COMMRT_SECRET_FILE" not in os.environ
        print(os.environ["COMMRT_HOST_ID"], os.environ["COMMRT_LOCAL_RANK"],
              os.environ["COMMRT_LOCAL_WORLD_SIZE"], os.environ["EXTRA"], sys.argv[1:])
        """)
    out = launch(["-n", "4", "--hosts", "h1:2,h2:2", "--ssh-cmd", FAKE_SSH, "--bind", "127.0.0.1",
                  "--env", "EXTRA=x", prog, "a b"])
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == [
        "[0] h1 0 2 x ['a b']", "[1] h1 1 2 x ['a b']",
        "[2] h2 0 2 x ['a b']", "[3] h2 1 2 x ['a b']"]
    assert_no_orphans(script.pid_dir)


def test_ring_through_a_stand_in_ssh(script):
    out = launch(["-n", "4", "--hosts", "h1:2,h2:2", "--ssh-cmd", FAKE_SSH, "--bind",
                  "127.0.0.1", script(RING)], env=clean_env(COMMRT_TIMEOUT="30"))
    assert out.returncode == 0, out.stderr
    assert sum("ring ok" in line for line in out.stdout.splitlines()) == 4


def test_remote_failure_and_signal_are_propagated(script):
    prog = script("""
        record_pid()
        if RANK == 3:
            while len(os.listdir(PIDS)) < SIZE:
                time.sleep(0.01)
            os.kill(os.getpid(), 9)
        time.sleep(60)
        """)
    out = launch(["-n", "4", "--hosts", "h1:2,h2:2", "--ssh-cmd", FAKE_SSH, "--bind", "127.0.0.1",
                  prog])
    assert out.returncode == 137
    assert "rank 3 (pid" in out.stderr and "on h2) was killed by SIGKILL" in out.stderr
    assert_no_orphans(script.pid_dir)


def test_sigkill_to_the_launcher_stops_remote_ranks(script):
    prog = script("""
        record_pid()
        time.sleep(60)
        """)
    proc = subprocess.Popen(LAUNCH + ["-n", "2", "--hosts", "h1,h2", "--ssh-cmd", FAKE_SSH,
                                      "--bind", "127.0.0.1", prog],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=clean_env())
    try:
        wait_for(lambda: len([p for p in script.pid_dir.iterdir() if p.read_text()]) == 2, 15,
                 "two ranks")
    finally:
        proc.kill()
        proc.wait()
    assert_no_orphans(script.pid_dir, within=3)


def test_unreachable_host_fails_clearly(script):
    prog = script("print('never')\n")
    out = launch(["-n", "2", "--hosts", "h1,h2", "--ssh-cmd", "false", prog])
    assert out.returncode == 1
    assert "rank 0 (pid" in out.stderr and "exited with code 1" in out.stderr


# -- two hosts as network namespaces ----------------------------------------------

def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def two_hosts():
    """Namespaces A and B joined by a veth pair: 10.251.X.1 in A, 10.251.X.2 in B."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = f"{os.getpid() % 100000}"
    a, b = f"crt{tag}a", f"crt{tag}b"
    net = f"10.251.{os.getpid() % 250}"
    try:
        _ip("netns", "add", a)
        _ip("netns", "add", b)
        _ip("link", "add", f"v{tag}a", "netns", a, "type", "veth", "peer", "name", f"v{tag}b",
            "netns", b)
        for ns, dev, addr in ((a, f"v{tag}a", f"{net}.1"), (b, f"v{tag}b", f"{net}.2")):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield a, b, f"{net}.1"
    finally:
        for ns in (a, b):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                                  timeout=10).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def test_two_host_job_across_network_namespaces(two_hosts, script):
    a, b, store_ip = two_hosts
    prog = script(RING + """
    from commrt.rendezvous.bootstrap import route_address
    print("address", r, route_address(os.environ["COMMRT_STORE_ADDR"].rsplit(":", 1)[0]))
    """)
    cmd = ["ip", "netns", "exec", a] + LAUNCH + [
        "-n", "4", "--hosts", f"{a}:2,{b}:2", "--ssh-cmd", "ip netns exec", "--bind", store_ip,
        "--timeout", "60", prog]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=90,
                         env=clean_env(COMMRT_TIMEOUT="30"))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = sorted(line for line in out.stdout.splitlines() if "ring ok" in line)
    assert lines == [f"[0] ring ok 0 4 {a} 0", f"[1] ring ok 1 4 {a} 1",
                     f"[2] ring ok 2 4 {b} 0", f"[3] ring ok 3 4 {b} 1"]
    assert_no_orphans(script.pid_dir)
    net = store_ip.rsplit(".", 1)[0]
    addresses = sorted(line for line in out.stdout.splitlines() if "address" in line)
    assert addresses == [f"[0] address 0 {net}.1", f"[1] address 1 {net}.1",
                         f"[2] address 2 {net}.2", f"[3] address 3 {net}.2"]


def test_network_interface_picks_the_store_address_across_namespaces(two_hosts, script):
    """--network-interface with a prefix names each namespace's own veth (vNNNa in
    A, vNNNb in B): the store listens on A's address and every rank uses its own."""
    a, b, store_ip = two_hosts
    prefix = "v" + a[3:-1]
    prog = script(RING + """
    print("store", r, os.environ["COMMRT_STORE_ADDR"].rsplit(":", 1)[0], os.environ["COMMRT_IFNAME"])
    """)
    cmd = ["ip", "netns", "exec", a] + LAUNCH + [
        "-np", "4", "-H", f"{a}:2,{b}:2", "--ssh-cmd", "ip netns exec",
        "--network-interface", prefix, "--timeout", "60", prog]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=90,
                         env=clean_env(COMMRT_TIMEOUT="30"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert sum("ring ok" in line for line in out.stdout.splitlines()) == 4
    stores = sorted(line.split()[1:] for line in out.stdout.splitlines() if "store" in line)
    assert stores == [["store", str(r), store_ip, prefix] for r in range(4)]
