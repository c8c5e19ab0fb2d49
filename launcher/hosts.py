"""Where the ranks go: parse --hosts / --hostfile and place ranks on hosts.

Ranks fill hosts in the order given, each up to its slots (block placement,
as mpirun's default ``--map-by slot``), so neighbouring ranks share a host
and its shared memory.
"""
import os
import re
import socket
from dataclasses import dataclass
from typing import List


@dataclass(frozen=True)
class Host:
    name: str
    slots: int


@dataclass(frozen=True)
class Placement:
    rank: int
    host: str
    local_rank: int
    local_size: int
    cross_rank: int = 0     # Horovod's: this host's place among the hosts that have a rank
    cross_size: int = 1     # with this local_rank, and how many such hosts there are


class HostSpecError(ValueError):
    """A malformed --hosts or --hostfile, or more ranks than slots."""


def parse_hosts(text: str) -> List[Host]:
    """``h1:4,h2:4`` (slots default to 1) -> [Host("h1", 4), Host("h2", 4)]."""
    hosts = []
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            raise HostSpecError(f"--hosts {text!r}: empty host entry")
        hosts.append(_host_entry(entry, f"--hosts entry {entry!r}"))
    return _merge(hosts)


def parse_hostfile(path: str) -> List[Host]:
    """One host a line: ``name``, ``name:4`` or ``name slots=4`` (mpirun's form);
    ``#`` starts a comment."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise HostSpecError(f"--hostfile {path}: {exc.strerror}") from None
    hosts = []
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"--hostfile {path}, line {number}"
        m = re.fullmatch(r"(\S+)\s+slots\s*=\s*(\S+)", line)
        hosts.append(_host_entry(f"{m.group(1)}:{m.group(2)}" if m else line, where))
    if not hosts:
        raise HostSpecError(f"--hostfile {path} names no host")
    return _merge(hosts)


def _host_entry(entry, where):
    name, colon, slots = entry.rpartition(":") if ":" in entry else (entry, "", "1")
    if not colon:
        name = entry
    if not name or re.search(r"\s", name):
        raise HostSpecError(f"{where}: bad host name {name!r}")
    if not slots.isdigit() or int(slots) < 1:
        raise HostSpecError(f"{where}: slots must be a positive integer, got {slots!r}")
    return Host(name, int(slots))


def _merge(hosts):
    """A host named twice gets the sum of its slots, at its first position."""
    merged = {}
    for h in hosts:
        merged[h.name] = merged.get(h.name, 0) + h.slots
    return [Host(n, s) for n, s in merged.items()]


def place(nprocs: int, hosts: List[Host]) -> List[Placement]:
    """Assign ranks 0..nprocs-1 to hosts in order, filling each host's slots."""
    total = sum(h.slots for h in hosts)
    if nprocs > total:
        raise HostSpecError(f"-n {nprocs} ranks but the hosts have only {total} slots "
                            f"({', '.join(f'{h.name}:{h.slots}' for h in hosts)})")
    counts, rank = [], 0
    for host in hosts:
        count = min(host.slots, nprocs - rank)
        if count:
            counts.append((host.name, count))
        rank += count
    placements, rank = [], 0
    for index, (name, count) in enumerate(counts):
        for local in range(count):
            cross_rank = sum(1 for _, c in counts[:index] if c > local)
            cross_size = sum(1 for _, c in counts if c > local)
            placements.append(Placement(rank, name, local, count, cross_rank, cross_size))
            rank += 1
    return placements


def is_local(name: str) -> bool:
    """Whether ``name`` is this machine (started directly, not through --ssh-cmd)."""
    if name in ("localhost", "127.0.0.1", "::1"):
        return True
    return name in (socket.gethostname(), socket.gethostname().split(".")[0],
                    os.uname().nodename)
