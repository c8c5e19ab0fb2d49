"""``python -m commrt.bench hoststate``: the host's fast or slow state, measured."""
import re

from commrt.bench import hoststate

LINE = re.compile(r"round_trip_us +([\d.]+) +copy_1MiB_us +([\d.]+) +stream_1MiB_us +([\d.]+)"
                  r" +stream_back_1MiB_us +([\d.]+) +read_4MiB_us +([\d.]+) +-> (fast|slow)$")


def test_a_stream_past_five_private_copies_is_the_slow_state():
    fast = {"round_trip_us": 1.2, "copy_1MiB_us": 23.0, "stream_1MiB_us": 39.0,
            "stream_back_1MiB_us": 41.0, "read_4MiB_us": 120.0}
    slow = dict(fast, round_trip_us=1.8, stream_1MiB_us=465.0)
    assert hoststate.state(fast) == "fast" and hoststate.state(slow) == "slow"
    assert hoststate.state(dict(fast, stream_back_1MiB_us=465.0)) == "slow"   # one way is enough
    assert hoststate.state(dict(fast, stream_1MiB_us=5 * 23.0)) == "fast"   # the bound itself
    assert hoststate.line(slow).endswith("-> slow")


def test_each_launch_prints_its_timings_and_its_state(capsys):
    assert hoststate.main(["--launches", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    m = LINE.search(lines[0])
    assert m, lines
    figures = [float(x) for x in m.groups()[:5]]
    assert all(f > 0 for f in figures), figures
    # the state named is the one the figures give
    t = dict(zip(hoststate.PROBES, figures))
    assert m.group(6) == hoststate.state(t)


def test_wait_stops_at_a_fast_launch_or_says_the_host_stayed_slow(capsys):
    rc = hoststate.main(["--wait", "0.1"])
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    states = [LINE.search(ln).group(6) for ln in lines]
    # a fast launch ends the wait at once; a slow one is retried until the bound
    assert states[-1] == ("fast" if rc == 0 else "slow"), (rc, lines)
    assert all(s == "slow" for s in states[:-1]), lines
    assert rc in (0, 1) and (rc == 0 or "still slow" in captured.err)
