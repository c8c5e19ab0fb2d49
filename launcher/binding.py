"""``--bind-to core``: each rank of a host on its own block of that host's cores.

As mpirun's ``--bind-to core``, with a block of cores instead of one where a
host has more cores than ranks: local rank k of n gets the k-th of n equal
blocks of the cores the launcher may use (its affinity mask, sorted), so
OMP_NUM_THREADS (cores // n) threads keep to their rank's block.  A bound
rank never migrates nor shares a core with another rank, which a
shared-memory stream needs most (its sender and receiver both run); the
benchmarks bind for that reason (bench/_coll.bind).  Everything a rank
starts inherits its block, data-loader workers included, which is why it is
not the default.
"""
import os


class BindError(ValueError):
    """The host's ranks outnumber the cores they could be bound to."""


def core_block(local_rank, local_size, cores=None):
    """The cores local rank local_rank of local_size binds to (cores: the mask to
    divide, default this process's)."""
    cores = sorted(os.sched_getaffinity(0) if cores is None else cores)
    if not 0 < local_size <= len(cores):
        # (the transport's cpulist writer, imported only here: the shim stays light)
        from commrt.transport.connect import cpu_list

        raise BindError(f"--bind-to core: {local_size} ranks on this host but "
                        f"{len(cores)} cores to bind them to ({cpu_list(cores)}); "
                        "fewer ranks, or --bind-to none")
    width = len(cores) // local_size
    return cores[local_rank * width:(local_rank + 1) * width]
