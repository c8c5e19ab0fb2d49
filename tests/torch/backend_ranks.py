"""Rank functions of the backend tests (tests/torch/spawn.py runs them)."""
import os
import time

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp


def _np(x):
    if isinstance(x, torch.Tensor):
        if x.dtype is torch.bfloat16:
            x = x.float()
        return x.detach().clone().numpy()
    if isinstance(x, (list, tuple)):
        return [_np(v) for v in x]
    return x


def every_op(rank, n):
    """Each torch.distributed operation once; results by name (compared across backends)."""
    out = {}
    r = rank + 1
    for dt in (torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8,
               torch.bfloat16, torch.float16):
        for name, op in (("sum", ReduceOp.SUM), ("prod", ReduceOp.PRODUCT),
                         ("min", ReduceOp.MIN), ("max", ReduceOp.MAX)):
            t = (torch.arange(13) % 3 + r).to(dt)
            dist.all_reduce(t, op=op)
            out[f"all_reduce_{name}_{dt}"] = _np(t)
    for name, op in (("band", ReduceOp.BAND), ("bor", ReduceOp.BOR), ("bxor", ReduceOp.BXOR)):
        t = torch.arange(17, dtype=torch.int64) * r + rank
        dist.all_reduce(t, op=op)
        out[f"all_reduce_{name}"] = _np(t)
    t = torch.tensor([rank % 2 == 0, True, False])
    dist.all_reduce(t, op=ReduceOp.MAX)
    out["all_reduce_bool_max"] = _np(t)
    c = torch.complex(torch.arange(5.) + r, -torch.arange(5.))
    dist.all_reduce(c)
    out["all_reduce_complex"] = _np(c)
    z = torch.zeros(0)
    dist.all_reduce(z)
    out["all_reduce_empty"] = _np(z)
    nc = (torch.arange(12.).reshape(3, 4) * r).t()
    dist.all_reduce(nc)
    out["all_reduce_noncontig"] = _np(nc)
    s0 = torch.tensor(float(r))
    dist.all_reduce(s0)
    out["all_reduce_0d"] = _np(s0)
    m = torch.arange(6.).reshape(2, 3) * r
    dist.all_reduce(m)
    out["all_reduce_2d"] = _np(m)
    leaf = torch.full((3,), float(r), requires_grad=True)
    dist.all_reduce(leaf)
    out["all_reduce_requires_grad"] = _np(leaf)
    for root in range(n):
        b = torch.arange(7.) * (rank + 1)
        dist.broadcast(b, root)
        out[f"broadcast_{root}"] = _np(b)
        t = torch.arange(7.) + rank
        dist.reduce(t, root, op=ReduceOp.SUM)
        if rank == root:
            out[f"reduce_{root}"] = _np(t)
    outs = [torch.zeros(3, 2) for _ in range(n)]
    dist.all_gather(outs, torch.full((3, 2), float(rank)))
    out["all_gather"] = _np(outs)
    coal = [[torch.zeros(2), torch.zeros(3, 3)] for _ in range(n)]
    dist.all_gather_coalesced(coal, [torch.full((2,), float(rank)), torch.full((3, 3), rank + .5)])
    out["all_gather_coalesced"] = _np(coal)
    outs2 = [torch.zeros(n * 2), torch.zeros(n * 3)]
    red2 = [torch.zeros(2), torch.zeros(1)]
    with dist._coalescing_manager():
        dist.all_gather_into_tensor(outs2[0], torch.full((2,), float(rank)))
        dist.all_gather_into_tensor(outs2[1], torch.full((3,), rank + 2.0))
    with dist._coalescing_manager():
        dist.reduce_scatter_tensor(red2[0], torch.arange(2. * n) + rank)
        dist.reduce_scatter_tensor(red2[1], torch.arange(1. * n) * rank)
    out["coalesced_all_gather_into_tensor"] = _np(outs2)
    out["coalesced_reduce_scatter_tensor"] = _np(red2)
    big = torch.zeros(n * 4, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(big, torch.full((4,), rank + 0.5, dtype=torch.bfloat16))
    out["all_gather_into_tensor"] = _np(big)
    gl = [torch.zeros(2) for _ in range(n)] if rank == 0 else None
    dist.gather(torch.full((2,), float(rank)), gl, dst=0)
    if rank == 0:
        out["gather"] = _np(gl)
    so = torch.zeros(3)
    dist.scatter(so, [torch.full((3,), float(q * 10)) for q in range(n)] if rank == 1 else None,
                 src=1)
    out["scatter"] = _np(so)
    rs = torch.zeros(2)
    dist.reduce_scatter(rs, [torch.full((2,), float(q + rank)) for q in range(n)])
    out["reduce_scatter"] = _np(rs)
    rst = torch.zeros(3)
    dist.reduce_scatter_tensor(rst, torch.arange(3. * n) * r)
    out["reduce_scatter_tensor"] = _np(rst)
    a2a_out = [torch.zeros(2) for _ in range(n)]
    dist.all_to_all(a2a_out, [torch.full((2,), float(rank * 10 + q)) for q in range(n)])
    out["all_to_all"] = _np(a2a_out)
    x = torch.arange(2. * n) + 100 * rank
    y = torch.zeros(2 * n)
    dist.all_to_all_single(y, x)
    out["all_to_all_single"] = _np(y)
    # unequal splits: rank r sends q+1 rows to rank q, receives r+1 rows from each
    ins = [q + 1 for q in range(n)]
    outs_ = [rank + 1] * n
    x = torch.arange(float(sum(ins) * 2)).reshape(-1, 2) + 1000 * rank
    y = torch.zeros(sum(outs_), 2)
    dist.all_to_all_single(y, x, outs_, ins)
    out["all_to_all_single_unequal"] = _np(y)
    t = torch.full((4,), float(r))
    dist.all_reduce_coalesced([t, torch.full((2,), 2. * r)]) if hasattr(
        dist, "all_reduce_coalesced") else None
    dist.barrier()
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    out["all_gather_object"] = objs
    lst = [f"from {rank}", rank] if rank == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    out["broadcast_object_list"] = lst
    go = [None] * n if rank == 0 else None
    dist.gather_object(("g", rank), go, dst=0)
    if rank == 0:
        out["gather_object"] = go
    sol = [None]
    dist.scatter_object_list(sol, [q * q for q in range(n)] if rank == 0 else None, src=0)
    out["scatter_object_list"] = sol
    return out


def point_to_point(rank, n):
    """send/recv with tags, a receive from any source (source_rank), batch_isend_irecv."""
    res = {}
    if rank == 0:
        got = []
        for _ in range(n - 1):
            t = torch.zeros(3)
            w = dist.irecv(t, tag=5)
            w.wait()
            got.append((w._source_rank(), _np(t)))
        res["any_source"] = sorted(got, key=lambda g: g[0])
        t = torch.zeros(2)
        dist.recv(t, 1, tag=9)
        res["tagged"] = _np(t)
    else:
        dist.send(torch.full((3,), float(rank)), 0, tag=5)
        if rank == 1:
            dist.send(torch.tensor([7., 8.]), 0, tag=9)
    send = torch.full((4,), float(rank), dtype=torch.bfloat16)
    recv = torch.zeros(4, dtype=torch.bfloat16)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % n),
           dist.P2POp(dist.irecv, recv, (rank - 1) % n)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    res["batch"] = _np(recv)
    return res


def async_and_futures(rank, n):
    """async_op returns at once; the Future completes with the tensors; then() chains."""
    t = torch.full((1 << 16,), float(rank + 1))
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future().then(lambda f: f.value()[0] * 2)
    doubled = fut.wait()
    w.wait()
    ws = [dist.all_reduce(torch.full((10,), float(i)), async_op=True) for i in range(20)]
    vals = [w.get_future().wait()[0][0].item() for w in ws]
    s = torch.full((3,), float(rank))
    dist.all_reduce(s, op=ReduceOp.SUM)          # a blocking call after async ones keeps order
    return float(doubled[0]), vals, float(s[0]), w.is_completed()


def works_of_blocking_calls(rank, n):
    """A ProcessGroup call with asyncOp False (the blocking fast path) still
    returns a completed Work whose Future holds the tensors; async Works report
    completion, success and their error (None) as gloo's do."""
    pg = dist.distributed_c10d._get_default_group()
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    t = torch.ones(3)
    w = pg.allreduce([t], opts)
    sync = [w.is_completed(), w.is_success(), w.wait(), w.get_future().value()[0] is t,
            t.tolist()]
    a = dist.all_reduce(torch.ones(5), async_op=True)
    a.wait()
    return sync, [a.is_completed(), a.is_success(), a.exception() is None,
                  a.get_future().value()[0].tolist()]


def same_tensor_changed(rank, n):
    """The blocking all_reduce keeps the NumPy view of its last small tensor: one
    tensor object all-reduced again after it changed in place (resized,
    re-typed through .data, given other storage, transposed) is reduced as
    it is now, never through the stale view."""
    r = float(rank + 1)
    out = []
    t = torch.full((4,), r)
    t.resize_(2)
    dist.all_reduce(t)
    dist.all_reduce(t)
    out.append(t.tolist())                              # (n(n+1)/2) * n
    t.resize_(4)                                        # the same memory, 4 elements
    t.fill_(r)
    dist.all_reduce(t)
    out.append(t.tolist())
    t.resize_(2)
    t.fill_(r)
    dist.all_reduce(t)
    out.append(t.tolist())
    t.data = t.view(torch.int32)                        # the same memory as int32
    t.fill_((rank + 1) << 24)                           # not summed alike as float32 bits
    dist.all_reduce(t)
    out.append([t.dtype == torch.int32] + t.tolist())
    t.set_(torch.full((3,), rank + 1, dtype=torch.int32))
    dist.all_reduce(t)
    out.append(t.tolist())
    m = torch.arange(6.).reshape(2, 3) * r
    dist.all_reduce(m)
    m.t_()
    dist.all_reduce(m)
    out.append(m.tolist())
    return out


def futures_on_the_worker(rank, n):
    """Who completes an async collective's Future: the communicator's worker
    while only C++ has chained on it (collect_all; DDP's reducer waits on it in
    C++), a completer thread once Python has (then): a Python callback that
    blocks on a later collective must not run on the worker that has to run
    that collective.  Reached from the worker anyway, Work.wait of a collective
    queued behind raises instead of hanging."""
    import threading

    flag = torch.zeros(1)
    a, b, c = torch.ones(4), torch.ones(4), torch.ones(4)
    later = []

    def on_worker(_):
        name = threading.current_thread().name
        try:
            later[0].wait()
            err = None
        except RuntimeError as exc:
            err = str(exc)
        return name, err

    if rank == 0:
        w1 = dist.all_reduce(a, async_op=True)
        f1 = w1.get_future().then(lambda _: threading.current_thread().name)
        w2 = dist.all_reduce(b, async_op=True)
        f2 = torch.futures.collect_all([w2.get_future()]).then(on_worker)
        later.append(dist.all_reduce(c, async_op=True))
        dist.send(flag, 1)                  # only now does rank 1 join the all-reduces
        out = [f1.wait(), f2.wait()]
    else:
        dist.recv(flag, 0)
        ws = [dist.all_reduce(t, async_op=True) for t in (a, b, c)]
        ws[1].get_future().wait()
        out = None
    for w in [later[0]] if later else ws:
        w.wait()
    dist.barrier()
    return out, [a.tolist(), b.tolist(), c.tolist()]


def wait_with_timeout(rank, n):
    """Work.wait(timeout) of an async collective a peer has not joined yet raises
    torch's "Timed out" error; the collective itself goes on and completes."""
    import datetime

    t = torch.ones(4)
    flag = torch.zeros(1)
    timed_out = None
    if rank == 0:
        w = dist.all_reduce(t, async_op=True)
        try:
            w.wait(datetime.timedelta(seconds=0.2))
            timed_out = False
        except RuntimeError as exc:
            timed_out = str(exc)
        dist.send(flag, 1)                  # only now does rank 1 join the all-reduce
    else:
        dist.recv(flag, 0)
        w = dist.all_reduce(t, async_op=True)
    w.wait()
    return timed_out, t.tolist()


def averages(rank, n):
    """AVG and PREMUL_SUM (gloo has neither): against the reference."""
    t = torch.arange(6.) * (rank + 1)
    dist.all_reduce(t, op=ReduceOp.AVG)
    p = torch.arange(6.) * (rank + 1)
    dist.all_reduce(p, op=dist._make_nccl_premul_sum(0.5))
    return _np(t), _np(p)


def subgroups(rank, n):
    """new_group over some ranks (built by members alone), new_subgroups, and a
    collective on the world between them."""
    res = {}
    g = dist.new_group([q for q in range(n) if q % 2 == 0])
    if rank % 2 == 0:
        t = torch.full((2,), float(rank))
        dist.all_reduce(t, group=g)
        res["even"] = _np(t)
        res["even_rank"] = dist.get_rank(g)
    sub, _ = dist.new_subgroups(group_size=2) if n % 2 == 0 else (None, None)
    if sub is not None:
        t = torch.ones(1)
        dist.all_reduce(t, group=sub)
        res["pairs"] = _np(t)
    w = torch.ones(1)
    dist.all_reduce(w)
    res["world"] = _np(w)
    return res


def ddp_train(rank, n, steps, model_name):
    """A few DDP steps from fixed seeds; the parameters at the end."""
    torch.manual_seed(0)
    if model_name == "cnn":
        model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(),
                                    torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3))
        shape = (4, 1, 8, 8)
    else:
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 4))
        shape = (4, 16)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(shape, generator=g)
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
    return [p.detach().numpy().copy() for p in model.parameters()]


def ddp_hooks(rank, n):
    """DDP with fp16_compress_hook and PowerSGD: runs and keeps ranks in step."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    res = []
    for hook in ("fp16", "powersgd"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 4))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        if hook == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        else:
            ddp.register_comm_hook(ps.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                                    start_powerSGD_iter=2), ps.powerSGD_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(rank)
        for _ in range(4):
            opt.zero_grad()
            ddp(torch.randn(8, 16, generator=g)).sum().backward()
            opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        res.append(_np(flat))
    return res


def mismatch(rank, n):
    """Ranks disagree on the size: every rank raises, none hangs."""
    t = torch.zeros(4 + rank)
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
    except RuntimeError as exc:
        return type(exc).__name__, type(exc.__cause__).__name__, time.monotonic() - t0
    return None


def dead_peer(rank, n):
    """The last rank dies; every survivor's next collective raises within 2 s."""
    dist.barrier()
    if rank == n - 1:
        os._exit(3)
    time.sleep(0.3)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(4))
    except RuntimeError as exc:
        return type(exc.__cause__).__name__, time.monotonic() - t0, str(exc)
    return None


def hung_peer(rank, n):
    """Rank 1 stays alive but never joins: the init timeout (3 s) ends rank 0's wait."""
    if rank == 1:
        time.sleep(6)
        return None
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
    except RuntimeError as exc:
        return type(exc.__cause__).__name__, time.monotonic() - t0
    return "no error"


def _fds():
    return len(os.listdir("/proc/self/fd"))


def repeated_init(rank, n, init_base, rounds):
    """init_process_group / destroy_process_group again and again: nothing leaks."""
    import datetime
    import threading

    counts = []
    for i in range(rounds):
        dist.init_process_group("commrt", init_method=f"{init_base}-{i}", rank=rank,
                                world_size=n, timeout=datetime.timedelta(seconds=60))
        t = torch.ones(8)
        dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
        assert t[0].item() == n * n
        dist.destroy_process_group()
        time.sleep(0.2)
        counts.append((_fds(), threading.active_count()))
    return counts
