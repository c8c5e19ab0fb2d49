"""Hosts as network namespaces joined by shaped links: each namespace is a host
to commrt (shared memory inside, TCP between), every all-reduce is right on
H x R = 2x2, 3x2, 2x3, 4x2, COMMRT_IFNAME moves the data plane, and nothing
is left behind."""
import os
import subprocess
import sys

import pytest

from commrt.bench import _netns
from scale_helpers import HERE, clean_env, ok_lines, run

pytestmark = pytest.mark.netns  # tests/conftest.py: such tests run one at a time

RANK = os.path.join(HERE, "hosts_rank.py")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("hosts,local", [(2, 2), (3, 2), (2, 3), (4, 2)])
def test_every_all_reduce_across_namespace_hosts(ns_hosts, hosts, local):
    h = ns_hosts(hosts, rate="2gbit")
    env = ("COMMRT_IFNAME=cmrt0", "COMMRT_RING_SEGMENT_BYTES=16K", "COMMRT_COST_CACHE=",
           "COMMRT_TIMEOUT=60")
    out = run(h.launch_cmd(local, [RANK, "layout", str(hosts)], timeout=150, env=env), 170)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = ok_lines(out)
    assert len(lines) == hosts * local, out.stdout
    for line in lines:
        rank = int(line.split()[1])
        assert f" {h.names[rank // local]} " in line + " ", line


@pytest.mark.alone  # a measured choice
@pytest.mark.timeout(120)
def test_a_slow_network_makes_the_model_pick_hierarchical_for_large_messages(ns_hosts):
    # 100 Mbit/s links: β_net is some 100x shared memory's, so at 16 MiB only the
    # leaders' bytes should cross (the flat algorithms send 1.5-3x as many)
    h = ns_hosts(2, rate="100mbit")
    out = run(h.launch_cmd(2, [RANK, "choice"], timeout=90,
                           env=("COMMRT_IFNAME=cmrt0", "COMMRT_COST_CACHE=")), 110)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    lines = ok_lines(out)
    assert len(lines) == 4 and len({line.split(" ", 2)[2] for line in lines}) == 1, lines
    assert lines[0].split()[4] == "hierarchical", lines[0]


@pytest.mark.alone  # measured times against bounds
@pytest.mark.timeout(90)
def test_a_shaped_link_lets_its_burst_through_once_idle(ns_hosts):
    """tc's token bucket, which the simulator's validation models (engine._Bucket):
    24 KiB, under the harness's 32 KiB burst, crosses a 100 Mbit/s link idle
    long enough to refill it far faster than the rate, and back to back (the
    bucket kept empty) at about the rate; the calibration's β of a burst's
    bytes (validate.burst_beta) is the unshaped path's, well under 1/rate."""
    from commrt.sim import validate

    h = ns_hosts(2, rate="100mbit")
    out = run(h.launch_cmd(1, [RANK, "burst"], timeout=60, env=("COMMRT_IFNAME=cmrt0",)), 80)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    lines = ok_lines(out)
    assert len(lines) == 2, out.stdout
    k = validate.BURST_SIZES[-1]
    at_rate = k / _netns.rate_bytes("100mbit")          # 1.97 ms
    idle, busy, beta = (float(x) for x in lines[0].split()[2:])
    assert idle < at_rate / 3, (idle, at_rate)
    assert busy > 0.7 * at_rate, (busy, at_rate)
    assert 0 < beta < 1 / _netns.rate_bytes("100mbit") / 3, beta


@pytest.mark.timeout(120)
def test_ifname_moves_the_data_plane_to_the_named_link(ns_hosts):
    h = ns_hosts(2, links=2)
    counts = {}
    for dev in ("cmrt0", "cmrt1"):
        out = run(h.launch_cmd(1, [RANK, "traffic", dev], timeout=60,
                               env=(f"COMMRT_IFNAME={dev}",)), 90)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        counts[dev] = sorted(int(line.split()[-1]) for line in ok_lines(out))
    # a 4 MiB ring all-reduce on 2 ranks sends 4 MiB each way, through the link named
    assert all(c > 4 << 20 for c in counts["cmrt0"]) and all(c > 4 << 20 for c in counts["cmrt1"])
    out = run(h.launch_cmd(1, [RANK, "traffic", "cmrt0"], timeout=60,
                           env=("COMMRT_IFNAME=cmrt1",)), 90)
    assert out.returncode == 0, out.stderr[-2000:]
    assert all(int(line.split()[-1]) < 1 << 20 for line in ok_lines(out)), out.stdout


@pytest.mark.timeout(60)
def test_unknown_ifname_names_the_interfaces_there(ns_hosts):
    h = ns_hosts(2)
    out = run(h.launch_cmd(1, [RANK, "hello"], timeout=30, env=("COMMRT_IFNAME=nosuch0",)), 50)
    assert out.returncode != 0
    assert "COMMRT_IFNAME='nosuch0'" in out.stderr and "cmrt0 (10.77.0." in out.stderr, \
        out.stderr[-2000:]


@pytest.mark.timeout(60)
def test_each_namespace_is_its_own_host_without_a_launcher_name(ns_hosts):
    h = ns_hosts(2)
    probe = ("import os; from commrt.rendezvous.bootstrap import _host_id; "
             "print(_host_id(os.environ))")
    ids = [run(h.exec(i, [sys.executable, "-c", probe]), 30).stdout.strip() for i in (0, 1)]
    name = os.uname().nodename
    assert ids == [f"{name}/{h.names[0]}", f"{name}/{h.names[1]}"]
    here = run([sys.executable, "-c", probe], 30).stdout.strip()
    assert "/" not in here


@pytest.mark.timeout(60)
def test_torn_down_on_failure_with_nothing_left(ns_hosts):
    hosts = _netns.Hosts(2, rate="100mbit")
    with pytest.raises(RuntimeError, match="boom"):
        with hosts:
            sleeper = subprocess.Popen(hosts.exec(1, ["sleep", "60"]))
            raise RuntimeError("boom")
    assert sleeper.wait(10) is not None
    assert not {n for n in _netns.existing() if n.startswith(hosts.name + "-")}


@pytest.mark.timeout(150)
def test_torchrun_across_namespace_hosts(ns_hosts, tmp_path):
    # one torchrun agent per host (static rendezvous at host 0); commrt ranks
    # bootstrap from torchrun's variables and find rank 0's store through the
    # rendezvous directory, every namespace a host of its own
    pytest.importorskip("torch")
    h = ns_hosts(2)
    env = clean_env(COMMRT_RENDEZVOUS_DIR=str(tmp_path / "rdv"), COMMRT_COST_CACHE="",
                    COMMRT_TIMEOUT="60")
    agents = [subprocess.Popen(
        h.exec(i, [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                   "--nproc-per-node", "2", "--node-rank", str(i), "--master-addr", h.addrs[0],
                   "--master-port", "29500", RANK, "hello"]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in (0, 1)]
    outs = []
    try:
        for a in agents:
            out, err = a.communicate(timeout=120)
            outs.append(out)
            assert a.returncode == 0, out[-2000:] + err[-3000:]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
    node = os.uname().nodename
    lines = ok_lines(subprocess.CompletedProcess([], 0, "".join(outs), ""))
    assert lines == [f"ok {r} 4 {node}/{h.names[r // 2]} -" for r in range(4)], outs


@pytest.mark.timeout(60)
def test_sigterm_of_the_process_holding_hosts_leaves_nothing(ns_hosts):
    # `timeout` and launchers stop a benchmark with SIGTERM: the namespaces go with it
    code = ("import sys, time\nfrom commrt.bench import _netns\n"
            "with _netns.Hosts(2, rate='100mbit') as h:\n"
            "    print(h.name, flush=True)\n    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        name = proc.stdout.readline().strip()
        assert name.startswith("cmrt-"), name
        assert any(n.startswith(name + "-") for n in _netns.existing())
        proc.terminate()
        assert proc.wait(30) == 128 + 15
    finally:
        proc.kill()
    assert not {n for n in _netns.existing() if n.startswith(name + "-")}
