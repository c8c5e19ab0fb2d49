"""N real processes running one function under torch.distributed, with a deadline.

run(fn, n, backend, *args, timeout=120) -> [fn(rank, n, *args) of every rank]: each
rank calls init_process_group(backend, file:// init) first and
destroy_process_group after; the first failure is re-raised with its rank and
traceback, and a rank that hangs past the deadline is killed and reported."""
import datetime
import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback


class RankError(RuntimeError):
    pass


def _child(fn, rank, n, backend, init, timeout_s, args, q, env):
    os.environ.update(env)
    try:
        import torch
        import torch.distributed as dist

        import commrt.torch  # noqa: F401

        torch.set_num_threads(1)
        if backend is not None:
            dist.init_process_group(backend, init_method=init, rank=rank, world_size=n,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        try:
            result = fn(rank, n, *args)
        finally:
            if backend is not None and dist.is_initialized():
                dist.destroy_process_group()
        q.put((rank, "ok", result))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        q.put((rank, "err", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def run(fn, n, backend, *args, timeout=120, pg_timeout=60, env=None):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    fd, path = tempfile.mkstemp(prefix="commrt-torch-init-")
    os.close(fd)
    os.unlink(path)
    procs = [ctx.Process(target=_child, args=(fn, r, n, backend, f"file://{path}", pg_timeout,
                                               args, q, dict(env or {})), daemon=True)
             for r in range(n)]
    for p in procs:
        p.start()
    results, deadline = {}, time.monotonic() + timeout
    try:
        while len(results) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(n)) - set(results))
                raise RankError(f"ranks {missing} did not finish within {timeout} s")
            try:
                rank, status, value = q.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)
                        and r not in results]
                if dead:
                    raise RankError(f"rank {dead[0]} died (exit code {procs[dead[0]].exitcode})")
                continue
            if status == "err":
                raise RankError(f"rank {rank}: {value}")
            results[rank] = value
        return [results[r] for r in range(n)]
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        if os.path.exists(path):
            os.unlink(path)
