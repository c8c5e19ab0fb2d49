"""What every rank's environment gets unless the user's environment already
sets it (local ranks, ranks started over ssh, elastic workers alike).

THP_MEM_ALLOC_ENABLE=1 asks PyTorch's CPU allocator (torch >= 2.2) to put
tensors of 2 MiB or more on transparent huge pages.  Its default leaves them
on 4 KiB pages wherever the kernel's THP mode is ``madvise`` (Ubuntu's and
Debian's default), and the kernel's single-copy reads between ranks run
about 3x slower over 4 KiB pages (docs/transport.md, "The kernel's copy
and alignment", pages).  Only PyTorch reads it; set it to 0 to keep 4 KiB
pages (each such tensor may then not hold up to 2 MiB of a huge page beyond
its end)."""

HUGE_PAGES = ("THP_MEM_ALLOC_ENABLE", "1")


def with_defaults(env, omp_threads):
    """env (a rank's full environment) with the launcher's defaults where unset:
    PYTHONUNBUFFERED=1, OMP_NUM_THREADS=omp_threads, huge pages for PyTorch."""
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("OMP_NUM_THREADS", str(omp_threads))
    env.setdefault(*HUGE_PAGES)
    return env
