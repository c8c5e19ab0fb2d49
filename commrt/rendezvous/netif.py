"""Network interfaces and namespaces: which address a rank uses, and which host it is.

Two processes on one machine but in different network namespaces (``ip netns``,
containers) cannot share memory through commrt's channels, which meet over
abstract Unix sockets, a per-namespace name space; to commrt they are two
hosts.  ``namespace()`` names this process's network namespace when it is not
the machine's own, and the host identity and the cost cache's key carry it.

``COMMRT_IFNAME`` picks the interface of the data plane (and of the address
rank 0 advertises for its store): a comma-separated list of names or name
prefixes (``eth``, ``ib0,eth1``), exact names first, then prefixes in the
order listed, as NCCL_SOCKET_IFNAME does.  Only IPv4 interfaces are seen.
"""
import fcntl
import os
import socket
import struct

from commrt.errors import BootstrapError

_SIOCGIFADDR = 0x8915


def _ns_id(path):
    st = os.stat(path)
    return st.st_dev, st.st_ino


def namespace():
    """None in the machine's own network namespace, else the namespace's name under
    /run/netns (``ip netns``), or ``netns:INODE`` for an unnamed one that differs
    from pid 1's (where pid 1's cannot be read, an unnamed one counts as the
    machine's own)."""
    try:
        mine = _ns_id("/proc/self/ns/net")
    except OSError:
        return None
    for base in ("/run/netns", "/var/run/netns"):
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        for name in names:
            try:
                if _ns_id(os.path.join(base, name)) == mine:
                    return name
            except OSError:
                continue
    try:
        if mine != _ns_id("/proc/1/ns/net"):
            return f"netns:{mine[1]}"
    except OSError:
        pass
    return None


def interface_addresses():
    """{interface name: IPv4 address} of the interfaces that have one."""
    out = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            req = struct.pack("256s", name.encode()[:15])
            try:
                res = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)
            except OSError:
                continue   # no IPv4 address
            out[name] = socket.inet_ntoa(res[20:24])
    return out


def pick_interface(spec):
    """(name, IPv4 address) of the first interface COMMRT_IFNAME's ``spec`` names."""
    wanted = [w.strip() for w in spec.split(",") if w.strip()]
    if not wanted:
        raise BootstrapError(f"COMMRT_IFNAME={spec!r} names no interface")
    have = interface_addresses()
    for w in wanted:
        if w in have:
            return w, have[w]
    for w in wanted:
        for name in sorted(have):
            if name.startswith(w):
                return name, have[name]
    listed = ", ".join(f"{n} ({a})" for n, a in sorted(have.items())) or "none"
    where = namespace()
    raise BootstrapError(f"COMMRT_IFNAME={spec!r}: no interface with an IPv4 address matches "
                         f"on {socket.gethostname()}"
                         + (f" (network namespace {where})" if where else "")
                         + f"; interfaces with one: {listed}")


def default_route_interface():
    """The interface of the IPv4 default route, or None."""
    try:
        with open("/proc/net/route") as f:
            rows = [line.split() for line in f.read().splitlines()[1:]]
    except OSError:
        return None
    for row in rows:
        if len(row) > 1 and row[1] == "00000000":
            return row[0]
    return None


def link_key(ifname_spec=None):
    """What names this host's network link in the cost cache: the namespace and the
    interface (COMMRT_IFNAME's, else the default route's)."""
    iface = None
    if ifname_spec:
        try:
            iface = pick_interface(ifname_spec)[0]
        except BootstrapError:
            iface = None
    iface = iface or default_route_interface() or "-"
    return f"{namespace() or '-'}:{iface}"
