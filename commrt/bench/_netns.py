"""Pretend hosts: network namespaces joined by rate-limited links through a bridge.

``Hosts(count, rate, links=1)`` builds, as a context manager (root and
iproute2):

    switch namespace  NAME-sw: per link L a bridge brL with one port pL.I per
                      host
    host namespaces   NAME-hI: loopback, and per link L a veth ``cmrtL`` (the
                      same names on every host, as eth0 on a cluster) at
                      10.77.L.(I+1)/24, whose other end is the switch's pL.I

Each link is shaped in both directions by tc's token-bucket filter (``tbf
rate RATE``) on the host's cmrtL (host to switch) and on the switch's pL.I
(switch to host); there is no netem, so links differ in rate, never in
delay.  Every name carries ``cmrt-PID-K`` (this process, a counter), so
concurrent runs never meet, and nothing is created in the machine's own
namespace: the addresses exist only inside these namespaces.  Leaving the
context (also on error) kills every process still inside them, then deletes
them, which destroys their links.  ``dp.Link`` (two hosts, one veth pair)
uses the same helpers.
"""
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time

IFNAME = "cmrt0"          # the host side of the first link, inside its namespace
_counter = itertools.count()


def missing_tools():
    """What this machine lacks for network namespaces (empty: nothing)."""
    lack = []
    if os.geteuid() != 0:
        lack.append("root")
    lack += [t for t in ("ip", "tc") if shutil.which(t) is None]
    return lack


def run(*cmd, timeout=20):
    """A command that must succeed; its stderr in the error."""
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: exit {out.returncode}: {out.stderr.strip()}")
    return out.stdout


def shape(ns, dev, rate, burst, latency="50ms"):
    """Replace dev's root qdisc in ns by tbf at rate (None: unshaped)."""
    subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"],
                   capture_output=True, timeout=20)
    if rate:
        run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
            rate, "burst", burst, "latency", latency)


_RATE_UNITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8,
               "tbit": 1e12 / 8, "bps": 1.0, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9}
_SIZE_UNITS = {"b": 1, "k": 1024, "kb": 1024, "m": 1 << 20, "mb": 1 << 20}


def _number_and_unit(text, units, what):
    text = str(text).strip().lower()
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(digits):]
    try:
        return float(digits) * units[unit]
    except (ValueError, KeyError):
        raise ValueError(f"{what} {text!r}: a number and one of {', '.join(units)}") from None


def rate_bytes(rate):
    """Bytes per second of a tc rate ("1gbit", "800mbit", "125mbps": SI, as tc
    reads them)."""
    return _number_and_unit(rate, _RATE_UNITS, "rate")


def size_bytes(size):
    """Bytes of a tc size ("36000b", "32kb", as tbf's burst: binary k and m)."""
    return int(_number_and_unit(size, _SIZE_UNITS, "size"))


def _exit_on_sigterm():
    """Make SIGTERM (``timeout``'s signal, a launcher's stop) unwind this process
    as SystemExit, so that ``with Hosts(...)`` removes its namespaces; returns
    the handler to restore, or None when not in a position to install one."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        return None                  # the program handles SIGTERM itself

    def unwind(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)
    return previous


def pids_in(ns):
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=20)
    return [int(p) for p in out.stdout.split() if p.isdigit()]


def remove(namespaces, grace=2.0):
    """SIGTERM every process in the namespaces, SIGKILL what is left after grace
    seconds, then delete them (their veths go with them)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [p for ns in namespaces for p in pids_in(ns)]
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if _alive(p)]
            time.sleep(0.05)
    for ns in namespaces:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def existing():
    return set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                              timeout=20).stdout.split())


class Hosts:
    """``count`` pretend hosts joined by links shaped to ``rate`` (None: unshaped)."""

    def __init__(self, count, rate=None, mtu=1500, burst=None, latency="50ms", links=1):
        if count < 1 or not 1 <= links <= 8:
            raise ValueError(f"Hosts: count must be >= 1 and links 1-8, got {count}, {links}")
        self.count, self.rate, self.mtu, self.latency = count, rate, int(mtu), latency
        self.links = links
        self.burst = burst or f"{max(4 * self.mtu, 32 * 1024)}b"
        self.name = f"cmrt-{os.getpid()}-{next(_counter)}"
        self.switch = f"{self.name}-sw"
        self.names = [f"{self.name}-h{i}" for i in range(count)]
        self.addrs = [self.addr(i) for i in range(count)]
        self._made = []

    @staticmethod
    def addr(i, link=0):
        """Host i's address on link `link`."""
        return f"10.77.{link}.{i + 1}"

    def describe(self):
        shaped = (f"each direction shaped by `tc qdisc add dev DEV root tbf rate {self.rate} "
                  f"burst {self.burst} latency {self.latency}`" if self.rate else "unshaped")
        return (f"{self.count} network namespaces, each a host with {self.links} veth "
                f"(cmrt0..., MTU {self.mtu}) to a bridge in a switch namespace, {shaped}")

    def __enter__(self):
        lack = missing_tools()
        if lack:
            raise RuntimeError(f"network namespaces need {', '.join(lack)}")
        self._on_term = _exit_on_sigterm()
        try:
            self._build()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _add_ns(self, ns):
        run("ip", "netns", "add", ns)
        self._made.append(ns)
        run("ip", "-n", ns, "link", "set", "lo", "up")

    def _build(self):
        sw = self.switch
        self._add_ns(sw)
        for ns in self.names:
            self._add_ns(ns)
        for k in range(self.links):
            run("ip", "-n", sw, "link", "add", f"br{k}", "type", "bridge")
            run("ip", "-n", sw, "link", "set", f"br{k}", "up")
            for i, ns in enumerate(self.names):
                dev, port = f"cmrt{k}", f"p{k}.{i}"
                # created straight inside the two namespaces: no name in the machine's own
                run("ip", "link", "add", dev, "netns", ns, "mtu", str(self.mtu), "type", "veth",
                    "peer", "name", port, "netns", sw, "mtu", str(self.mtu))
                run("ip", "-n", sw, "link", "set", port, "master", f"br{k}")
                run("ip", "-n", sw, "link", "set", port, "up")
                run("ip", "-n", ns, "addr", "add", f"{self.addr(i, k)}/24", "dev", dev)
                run("ip", "-n", ns, "link", "set", dev, "up")
        self.set_rate(self.rate)

    def set_rate(self, rate):
        """Shape every link to rate (None: unshaped), both directions."""
        self.rate = rate
        for k in range(self.links):
            for i, ns in enumerate(self.names):
                shape(ns, f"cmrt{k}", rate, self.burst, self.latency)
                shape(self.switch, f"p{k}.{i}", rate, self.burst, self.latency)

    def __exit__(self, *exc):
        made, self._made = self._made, []
        remove(made)
        if getattr(self, "_on_term", None) is not None:
            signal.signal(signal.SIGTERM, self._on_term)
            self._on_term = None

    def exec(self, i, argv):
        """argv run inside host i."""
        return ["ip", "netns", "exec", self.names[i], *argv]

    def launch_cmd(self, ranks_per_host, argv, timeout=120, env=()):
        """commrt-launch in host 0 starting ``ranks_per_host`` ranks on every host
        through ``ip netns exec``; argv is the program and its arguments."""
        hosts = ",".join(f"{ns}:{ranks_per_host}" for ns in self.names)
        cmd = [sys.executable, "-m", "commrt.launcher", "-n", str(ranks_per_host * self.count),
               "--hosts", hosts, "--ssh-cmd", "ip netns exec", "--bind", self.addrs[0],
               "--timeout", str(int(timeout))]
        for kv in env:
            cmd += ["--env", kv]
        return self.exec(0, cmd + list(argv))
