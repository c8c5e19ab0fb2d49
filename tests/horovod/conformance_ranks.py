"""Rank functions for the behaviours of Horovod's test/parallel/test_torch.py (CPU)
that hvd_ranks.py does not already hold.  Each returns the list of the checks
that failed on its rank (empty when all hold), so a failure names itself."""
import inspect
import os
import itertools

import torch

import commrt.horovod.torch as hvd
from hvd_ranks import DTYPES, _tensor, horovod

INT_FLOAT = [torch.int32, torch.int64, torch.float32, torch.float64]


class Checks(list):
    def __call__(self, label, ok):
        if not ok:
            self.append(label)

    def raises(self, label, exc, fn):
        try:
            fn()
        except exc:
            return
        except Exception as other:               # the wrong kind of error
            self.append(f"{label}: {type(other).__name__}: {other}")
            return
        self.append(f"{label}: did not raise")


def product_per_dtype(comm):
    """test_horovod_allreduce_product: every dtype and dimension, against the product of
    every rank's tensor."""
    bad = Checks()
    with horovod(comm):
        r, n = hvd.rank(), hvd.size()
        for dtype, dim in itertools.product(INT_FLOAT + [torch.float16], [1, 2, 3]):
            mine = (torch.arange(4 ** dim).reshape([4] * dim) % 3 + 1 + (r == 1)).to(dtype)
            want = mine.double() * 0 + 1
            for q in range(n):
                want = want * ((torch.arange(4 ** dim).reshape([4] * dim) % 3 + 1 + (q == 1))
                               .double())
            got = hvd.allreduce(mine, op=hvd.Product)
            bad(f"product {dtype} dim {dim}", got.dtype == dtype and
                torch.allclose(got.double(), want))
    return bad


def fused_async_of_every_kind(comm):
    """test_horovod_{allreduce,allgather,reducescatter}_async_fused: many operations in
    flight at once, then synchronized, each with its own result."""
    bad = Checks()
    with horovod(comm):
        r, n = hvd.rank(), hvd.size()
        ar = [hvd.allreduce_async(torch.full((5,), float(i + r)), name=f"af.ar.{i}", op=hvd.Sum)
              for i in range(10)]
        ag = [hvd.allgather_async(torch.full((r + 1, 2), float(i)), name=f"af.ag.{i}")
              for i in range(10)]
        rs = [hvd.reducescatter_async(torch.full((2 * n, 3), float(i * (r + 1))),
                                      name=f"af.rs.{i}", op=hvd.Sum) for i in range(10)]
        tri = n * (n - 1) / 2
        for i, h in enumerate(ar):
            bad(f"allreduce {i}", torch.equal(hvd.synchronize(h), torch.full((5,), i * n + tri)))
        for i, h in enumerate(ag):
            out = hvd.synchronize(h)
            bad(f"allgather {i}", out.shape == (n * (n + 1) // 2, 2) and torch.all(out == i))
        for i, h in enumerate(rs):
            bad(f"reducescatter {i}", torch.equal(hvd.synchronize(h),
                                                  torch.full((2, 3), i * n * (n + 1) / 2)))
    return bad


def duplicate_names_of_every_kind(comm):
    """test_horovod_{allgather,broadcast,reducescatter}_duplicate_name_error: a second
    operation under a name in flight raises ValueError; the first still completes."""
    bad = Checks()
    # the first op completes once every rank has submitted it, and a rank held off
    # the core between its two calls (a loaded host) would see it done, not in flight
    # (Horovod's test has the same race): rounds start at most once a cycle, so a
    # long cycle right after a barrier's round keeps the first op in flight meanwhile
    os.environ["HOROVOD_CYCLE_TIME"] = "500"
    try:
        return _duplicate_names(comm, bad)
    finally:
        del os.environ["HOROVOD_CYCLE_TIME"]


def _duplicate_names(comm, bad):
    with horovod(comm):
        n = hvd.size()
        hvd.barrier()
        starts = {"allgather": lambda: hvd.allgather_async(torch.ones(2), name="dup"),
                  "broadcast": lambda: hvd.broadcast_async(torch.ones(2), 0, name="dup"),
                  "broadcast_": lambda: hvd.broadcast_async_(torch.ones(2), 0, name="dup"),
                  "reducescatter": lambda: hvd.reducescatter_async(torch.ones(n), name="dup"),
                  "alltoall": lambda: hvd.alltoall_async(torch.ones(n), name="dup")}
        for kind, start in starts.items():
            h = start()
            bad.raises(f"{kind} twice", ValueError, start)
            hvd.synchronize(h)
            hvd.barrier()
    return bad


def type_and_shape_errors(comm):
    """The *_type_error and rank errors: ranks that disagree on the dtype (or on the
    dimensions beyond the first) raise on every rank, and the job goes on."""
    bad = Checks()
    with horovod(comm):
        r, n = hvd.rank(), hvd.size()
        dt = torch.int32 if r % 2 == 0 else torch.float32
        cases = {
            "allgather dtype": lambda: hvd.allgather(torch.ones(2, 3, dtype=dt)),
            "allgather ndim": lambda: hvd.allgather(torch.ones([2] * (2 + r % 2))),
            "broadcast dtype": lambda: hvd.broadcast(torch.ones(3, dtype=dt), 0),
            "broadcast shape": lambda: hvd.broadcast(torch.ones(3 + r), 0),
            "alltoall dtype": lambda: hvd.alltoall(torch.ones(n, dtype=dt)),
            "alltoall rank": lambda: hvd.alltoall(torch.ones(n, 2 + r)),
            "reducescatter dtype": lambda: hvd.reducescatter(torch.ones(n, dtype=dt)),
            "grouped_allreduce shape": lambda: hvd.grouped_allreduce(
                [torch.ones(2), torch.ones(3 + r)]),
        }
        for label, case in cases.items():
            bad.raises(label, RuntimeError, case)
        bad.raises("alltoall equal split length", ValueError,
                   lambda: hvd.alltoall(torch.ones(n + 1)))
        bad.raises("reducescatter Adasum", (NotImplementedError, ValueError),
                   lambda: hvd.reducescatter(torch.ones(n), op=hvd.Adasum))
        bad.raises("reducescatter Min", ValueError,
                   lambda: hvd.reducescatter(torch.ones(n), op=hvd.Min))
        bad("still working", hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n)
    return bad


def reducescatter_variants(comm):
    """test_horovod_(grouped_)reducescatter{,_average,_prescale,_postscale}: per dtype and
    dimension, Sum and Average, with scale factors."""
    bad = Checks()
    with horovod(comm):
        r, n = hvd.rank(), hvd.size()
        for dtype, dim in itertools.product([torch.int32, torch.float32, torch.float64], [1, 2]):
            t = _tensor(dtype, dim, n=2 * n)
            rows = slice(2 * r, 2 * r + 2)
            s = hvd.reducescatter(t, op=hvd.Sum)
            bad(f"sum {dtype} {dim}", s.dtype == dtype and torch.equal(s, (t * n)[rows]))
            a = hvd.reducescatter(t, op=hvd.Average)
            bad(f"average {dtype} {dim}", torch.allclose(a.double(), t[rows].double()))
        t = torch.ones(2 * n, 2, dtype=torch.float64) * (r + 1)
        total = n * (n + 1) / 2
        pre = hvd.reducescatter(t, op=hvd.Sum, prescale_factor=0.5)
        post = hvd.reducescatter(t, op=hvd.Average, postscale_factor=4.0)
        bad("prescale", torch.allclose(pre, torch.full((2, 2), total * 0.5, dtype=torch.float64)))
        bad("postscale", torch.allclose(post, torch.full((2, 2), total / n * 4.0,
                                                         dtype=torch.float64)))
        g = hvd.grouped_reducescatter([t, t[:, :1].contiguous()], op=hvd.Sum,
                                      prescale_factor=2.0, postscale_factor=0.25)
        bad("grouped scaled", all(torch.allclose(x, torch.full_like(x, total * 0.5)) for x in g)
            and g[1].shape == (2, 1))
        ga = hvd.grouped_reducescatter([t, t * 2], op=hvd.Average)
        bad("grouped average", torch.allclose(ga[1], ga[0] * 2) and
            torch.allclose(ga[0], torch.full((2, 2), total / n, dtype=torch.float64)))
    return bad


def on_process_sets(comm):
    """test_horovod_*_process_sets: grouped allreduce, alltoall and reducescatter, and the
    gradients of allreduce, allgather and broadcast, on a process set."""
    bad = Checks()
    with horovod(comm):
        r, n = hvd.rank(), hvd.size()
        evens = hvd.add_process_set([q for q in range(n) if q % 2 == 0])
        odds = hvd.add_process_set([q for q in range(n) if q % 2 == 1])
        ps = evens if r % 2 == 0 else odds
        m, me = ps.size(), ps.rank()
        total = float(sum(q + 1 for q in ps.ranks))
        g = hvd.grouped_allreduce([torch.ones(2) * (r + 1), torch.ones(3) * (r + 1)],
                                  op=hvd.Sum, process_set=ps)
        bad("grouped allreduce", all(torch.all(x == total) for x in g))
        out, recv = hvd.alltoall(torch.full((m,), float(r)), torch.ones(m, dtype=torch.int32),
                                 process_set=ps)
        bad("alltoall", out.tolist() == [float(q) for q in ps.ranks] and recv.tolist() == [1] * m)
        s = hvd.reducescatter(torch.ones(m, 2) * (r + 1), op=hvd.Sum, process_set=ps)
        bad("reducescatter", torch.all(s == total) and s.shape == (1, 2))
        x = torch.ones(3, requires_grad=True)
        hvd.allreduce(x, op=hvd.Sum, process_set=ps).backward(torch.ones(3))
        bad("allreduce grad", torch.all(x.grad == m))
        x = torch.ones(me + 1, 2, requires_grad=True)
        y = hvd.allgather(x, process_set=ps)
        y.backward(torch.ones_like(y) * 3)
        bad("allgather grad", y.shape[0] == m * (m + 1) // 2 and torch.all(x.grad == 3))
        x = torch.ones(2, requires_grad=True)
        hvd.broadcast(x, 0, process_set=ps).backward(torch.ones(2))
        bad("broadcast grad", torch.all(x.grad == (1.0 if me == 0 else 0.0)))
        hvd.barrier(process_set=ps)
        hvd.barrier()
        for s_ in (odds, evens):
            hvd.remove_process_set(s_)
    return bad


def gradients_by_value(comm):
    """test_horovod_{alltoall,alltoall_equal_split,grouped_allgather,allreduce_average,
    reducescatter_average}_grad: the gradients' values, not only their shapes."""
    bad = Checks()
    with horovod(comm):
        r, n = hvd.rank(), hvd.size()
        splits = torch.tensor([q + 1 for q in range(n)], dtype=torch.int32)   # q+1 rows to q
        x = torch.arange(sum(range(1, n + 1)), dtype=torch.float32).requires_grad_(True)
        out, recv = hvd.alltoall(x, splits)
        out.backward(torch.full_like(out, float(r + 1)))
        # row j of x went to rank q (its block); its gradient is q's upstream gradient
        owner = torch.cat([torch.full((q + 1,), float(q + 1)) for q in range(n)])
        bad("alltoall grad", torch.equal(x.grad, owner))
        x = (torch.arange(2 * n, dtype=torch.float32) + 10 * r).requires_grad_(True)
        out = hvd.alltoall(x)
        out.backward(out.detach())               # the gradient of 0.5 * |out|^2
        bad("alltoall equal split grad", torch.equal(x.grad, x.detach()))
        xs = [torch.ones(r + 1, 2, requires_grad=True), torch.ones(2, 1, requires_grad=True)]
        ys = hvd.grouped_allgather(xs)
        sum((y * (i + 2)).sum() for i, y in enumerate(ys)).backward()
        bad("grouped allgather grad", torch.all(xs[0].grad == 2) and torch.all(xs[1].grad == 3))
        x = torch.ones(4, requires_grad=True)
        hvd.allreduce(x, op=hvd.Average).backward(torch.full((4,), float(r + 1)))
        bad("allreduce average grad", torch.allclose(x.grad, torch.full((4,), (n + 1) / 2)))
        x = torch.ones(2 * n, 2, requires_grad=True)
        hvd.reducescatter(x, op=hvd.Average).backward(torch.ones(2, 2))
        bad("reducescatter average grad", torch.allclose(x.grad, torch.ones(2 * n, 2)))
        xs = [torch.ones(3, requires_grad=True), torch.ones(2, requires_grad=True)]
        ys = hvd.grouped_allreduce(xs, op=hvd.Average)
        (ys[0].sum() * (r + 1) + ys[1].sum()).backward()
        bad("grouped allreduce average grad", torch.allclose(xs[0].grad,
                                                             torch.full((3,), (n + 1) / 2)))
    return bad


def _optimizers():
    """Every optimizer of torch.optim that takes dense gradients of any shape."""
    return sorted((c for c in torch.optim.Optimizer.__subclasses__()
                   if c.__module__.startswith("torch.optim")
                   and c not in (torch.optim.LBFGS, torch.optim.SparseAdam)
                   and c.__name__ != "Muon"), key=lambda c: c.__name__)


def broadcast_state_every_optimizer(comm):
    """test_broadcast_state, _options and _no_grad: for each optimizer, ranks that
    trained apart (different data, learning rates and options) hold rank 0's
    parameters, state and options after broadcast_parameters + broadcast_optimizer_state,
    and take identical steps after it; a parameter without requires_grad is left out."""
    bad = Checks()
    with horovod(comm):
        r = hvd.rank()
        for cls in _optimizers():
            torch.manual_seed(r)
            model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(),
                                        torch.nn.Linear(3, 2))
            model[2].bias.requires_grad_(False)              # _no_grad
            sig = inspect.signature(cls.__init__).parameters
            opts = {k: v for k, v in dict(lr=0.01 * (r + 1), momentum=0.1 * (r + 1),
                                          weight_decay=0.01 * r).items() if k in sig}
            opt = cls([p for p in model.parameters() if p.requires_grad], **opts)
            opt = hvd.DistributedOptimizer(opt, named_parameters=[
                (k, v) for k, v in model.named_parameters() if v.requires_grad])
            with opt.skip_synchronize():                    # a local step: states differ
                model(torch.randn(5, 4)).sum().backward()
                opt.synchronize()
                opt.step()
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            hvd.broadcast_optimizer_state(opt, root_rank=0)
            state = opt.state_dict()
            mine = {"params": [p.detach().tolist() for p in model.parameters()],
                    "options": {k: v for k, v in state["param_groups"][0].items()
                                if k != "params"},
                    "state": {i: {k: (v.tolist() if torch.is_tensor(v) else v)
                                  for k, v in s.items()} for i, s in state["state"].items()}}
            everyone = hvd.allgather_object(mine)
            name = cls.__name__
            bad(f"{name} parameters", all(e["params"] == everyone[0]["params"] for e in everyone))
            bad(f"{name} options", all(e["options"] == everyone[0]["options"] for e in everyone))
            bad(f"{name} state", all(e["state"] == everyone[0]["state"] for e in everyone))
            bad(f"{name} root's lr", opt.param_groups[0]["lr"] == 0.01)
            bad(f"{name} frozen bias untouched", not model[2].bias.requires_grad)
            torch.manual_seed(100)                          # one batch for every rank
            opt.zero_grad()
            model(torch.randn(5, 4)).sum().backward()
            opt.step()
            after = hvd.allgather_object([p.detach().tolist() for p in model.parameters()])
            bad(f"{name} same step after", all(a == after[0] for a in after))
    return bad


def backward_passes_errors(comm):
    """test_torch.py's backward_passes_per_step rules: a gradient computed more often
    than backward_passes_per_step before step() raises; synchronize() then step()
    under skip_synchronize() resets the count; passes <= 0 are refused."""
    bad = Checks()
    with horovod(comm):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       backward_passes_per_step=2)
        x = torch.ones(2, 3)
        for _ in range(2):
            model(x).sum().backward()
        bad.raises("a third backward", AssertionError, lambda: model(x).sum().backward())
        opt.synchronize()
        with opt.skip_synchronize():
            opt.step()
        opt.zero_grad()
        for _ in range(2):
            model(x).sum().backward()
        opt.step()
        bad("steps again after the reset", True)
        bad.raises("passes 0", ValueError, lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters(), backward_passes_per_step=0))
        bad.raises("Adasum optimizer", NotImplementedError, lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters(), op=hvd.Adasum))
    return bad


def barriers_between_collectives(comm):
    """test_barrier_with_multiple_collectives, test_process_set_barrier_op: a barrier
    between async collectives in flight orders nothing wrongly and they complete."""
    bad = Checks()
    with horovod(comm):
        r, n = hvd.rank(), hvd.size()
        h1 = hvd.allreduce_async(torch.ones(3) * r, name="bmc.1", op=hvd.Sum)
        h2 = hvd.allgather_async(torch.tensor([r]), name="bmc.2")
        hvd.barrier()
        h3 = hvd.broadcast_async(torch.tensor([float(r)]), n - 1, name="bmc.3")
        bad("allreduce", torch.all(hvd.synchronize(h1) == n * (n - 1) / 2))
        bad("allgather", hvd.synchronize(h2).tolist() == list(range(n)))
        bad("broadcast", hvd.synchronize(h3).item() == n - 1)
        ps = hvd.add_process_set([0, n - 1])
        if ps.included():
            hvd.barrier(process_set=ps)
        hvd.barrier()
        hvd.remove_process_set(ps)
    return bad


def allgather_every_dtype_uneven(comm):
    """test_horovod_allgather_variable_size over every dtype: first dimensions differ,
    rows land in rank order."""
    bad = Checks()
    with horovod(comm):
        r, n = hvd.rank(), hvd.size()
        sizes = [3, 0, 2, 7, 1][:n]
        for dtype, dim in itertools.product(DTYPES, [1, 2, 3]):
            mine = torch.full([sizes[r]] + [2] * (dim - 1), r).to(dtype)
            out = hvd.allgather(mine)
            want = torch.cat([torch.full([sizes[q]] + [2] * (dim - 1), q).to(dtype)
                              for q in range(n)])
            bad(f"{dtype} dim {dim}", out.dtype == dtype and torch.equal(out, want))
    return bad
