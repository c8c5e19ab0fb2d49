"""Rank functions of the Horovod API tests (run on every rank of a World).

Each starts Horovod on the world's communicator, checks what Horovod's own
test/parallel/test_torch.py checks for that behaviour, shuts Horovod down
and returns what the test asserts across ranks.
"""
import contextlib
import itertools
import os
import time

import torch

import commrt.horovod.torch as hvd

DTYPES = [torch.int32, torch.int64, torch.float32, torch.float64, torch.float16, torch.bfloat16]


@contextlib.contextmanager
def horovod(comm, **env):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    hvd.init(comm=comm)
    try:
        yield
    finally:
        hvd.shutdown()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _tensor(dtype, dim, seed=1234, n=17):
    torch.manual_seed(seed)
    return torch.FloatTensor(*([n] * dim)).random_(-100, 100).to(dtype)


def basics(comm):
    with horovod(comm):
        out = dict(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                   local_size=hvd.local_size(), cross_rank=hvd.cross_rank(),
                   cross_size=hvd.cross_size(), homogeneous=hvd.is_homogeneous(),
                   initialized=hvd.is_initialized(), gloo=(hvd.gloo_built(), hvd.gloo_enabled()),
                   others=(hvd.mpi_built(), hvd.nccl_built(), hvd.cuda_built(), hvd.rocm_built()))
    out["after"] = hvd.is_initialized()
    with horovod(comm):         # init() again after shutdown()
        out["again"] = hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist()
    return out


def allreduce_ops(comm):
    with horovod(comm):
        n, r = hvd.size(), hvd.rank()
        for dtype, dim in itertools.product(DTYPES, [1, 2, 3]):
            t = _tensor(dtype, dim)
            summed = hvd.allreduce(t, average=False)
            assert summed.dtype == dtype and summed.shape == t.shape
            assert torch.equal(summed.float(), (t.float() * n).to(dtype).float()), (dtype, dim)
            if dtype not in (torch.float16, torch.bfloat16):
                avg = hvd.allreduce(t, average=True)
                assert torch.allclose(avg.double(), t.double()), (dtype, dim)
            mine = _tensor(dtype, dim, seed=1234 + r)
            lo, hi = hvd.allreduce(mine, op=hvd.Min), hvd.allreduce(mine, op=hvd.Max)
            alls = torch.stack([_tensor(dtype, dim, seed=1234 + q) for q in range(n)])
            assert torch.equal(lo, alls.min(0).values) and torch.equal(hi, alls.max(0).values)
        small = torch.tensor([1.5, -2.0, 3.0], dtype=torch.float64)
        assert torch.allclose(hvd.allreduce(small, op=hvd.Product), small ** n)
        ints = torch.tensor([7, -7, 5], dtype=torch.int32) * (r + 1)
        want = (ints.new_tensor([7, -7, 5]) * sum(range(1, n + 1))).div(n, rounding_mode="trunc")
        assert torch.equal(hvd.allreduce(ints, op=hvd.Average), want)
        # in place, prescale, postscale
        t = torch.ones(5) * (r + 1)
        assert hvd.allreduce_(t, op=hvd.Sum) is t and torch.equal(t, torch.ones(5) * n * (n + 1) / 2)
        t = torch.ones(4, dtype=torch.float64)
        pre = hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5)
        post = hvd.allreduce(t, op=hvd.Sum, postscale_factor=3.0)
        assert torch.allclose(pre, t * n * 0.5) and torch.allclose(post, t * n * 3.0)
        # async and fused: many in flight at once
        hs = [hvd.allreduce_async(torch.full((3, 3), float(i)), name=f"fused.{i}", op=hvd.Sum)
              for i in range(20)]
        for i, h in enumerate(hs):
            assert torch.equal(hvd.synchronize(h), torch.full((3, 3), float(i * n)))
        with contextlib.suppress(NotImplementedError):
            hvd.allreduce(t, op=hvd.Adasum)
            raise AssertionError("Adasum did not raise")
        return hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum).item()


def grouped_ops(comm):
    with horovod(comm):
        n = hvd.size()
        ts = [_tensor(torch.float32, d) for d in (1, 2, 3)]
        out = hvd.grouped_allreduce(ts, op=hvd.Sum)
        assert all(torch.equal(o, t * n) for o, t in zip(out, ts))
        copies = [t.clone() for t in ts]
        hvd.grouped_allreduce_(copies, op=hvd.Average)
        assert all(torch.allclose(c, t) for c, t in zip(copies, ts))
        xs = [torch.ones(hvd.rank() + 1, 2) * hvd.rank(), torch.ones(1, 3)]
        g = hvd.grouped_allgather(xs)
        assert g[0].shape == (n * (n + 1) // 2, 2) and g[1].shape == (n, 3)
        rs = hvd.grouped_reducescatter([torch.ones(n * 2, 2), torch.ones(n, 1)], op=hvd.Sum)
        assert torch.equal(rs[0], torch.full((2, 2), float(n))) and rs[1].shape == (1, 1)
        return True


def order_and_names(comm):
    """Ranks submit in different orders; each name still meets its own tensor."""
    with horovod(comm):
        r, n = hvd.rank(), hvd.size()
        names = [f"t{i}" for i in range(8)]
        order = names[r:] + names[:r] if r % 2 == 0 else list(reversed(names))
        hs = {nm: hvd.allreduce_async(torch.full((4,), float(int(nm[1:]) + r)), name=nm,
                                      op=hvd.Sum) for nm in order}
        for nm in names:
            i = int(nm[1:])
            assert torch.equal(hvd.synchronize(hs[nm]), torch.full((4,), float(i * n + n * (n - 1) / 2)))
        # two ops in flight under one name: ValueError at the second submission
        h = hvd.allreduce_async(torch.ones(3), name="duplicate_name")
        try:
            hvd.allreduce_async(torch.ones(3), name="duplicate_name")
            raise AssertionError("a second op with one name did not raise")
        except ValueError:
            pass
        hvd.synchronize(h)
        return True


def real_async(comm):
    """poll() is False while the op waits for a rank that has not submitted yet."""
    with horovod(comm):
        if hvd.rank() == 0:
            h = hvd.allreduce_async(torch.ones(1000), name="late", op=hvd.Sum)
            in_flight = hvd.poll(h)
            hvd.barrier()                       # only now do the others submit
            out = hvd.synchronize(h)
        else:
            hvd.barrier()
            in_flight = None
            out = hvd.synchronize(hvd.allreduce_async(torch.ones(1000), name="late", op=hvd.Sum))
        return in_flight, out[0].item()


def waiting_caller_gets_rounds_at_once(comm):
    """A caller that waits is not held a whole HOROVOD_CYCLE_TIME (20 s here) by a
    round that finished only part of what it needs: rank 0 waits for "b" while the
    others first submit "z" and compute; their rounds finish "b", and the next
    round, the one "z" needs on every rank, starts at once.  -> seconds each rank
    spent."""
    with horovod(comm, HOROVOD_CYCLE_TIME=20000):
        t0 = time.monotonic()
        if hvd.rank() == 0:
            hvd.synchronize(hvd.allreduce_async(torch.ones(4), name="b"))
            z = hvd.synchronize(hvd.allreduce_async(torch.ones(4), name="z", op=hvd.Sum))
        else:
            hz = hvd.allreduce_async(torch.ones(4), name="z", op=hvd.Sum)
            time.sleep(0.3)                     # computing
            hb = hvd.allreduce_async(torch.ones(4), name="b")
            z = hvd.synchronize(hz)
            hvd.synchronize(hb)
        assert z.tolist() == [float(hvd.size())] * 4, z
        return time.monotonic() - t0


def cache_and_fusion(comm, threshold):
    """A steady step negotiates once; fusion packs small tensors (threshold 0: never)."""
    with horovod(comm, HOROVOD_FUSION_THRESHOLD=threshold, HOROVOD_CYCLE_TIME=5):
        stats = hvd._runtime.current().coordinator.stats
        grads = [torch.full((16,), float(i)) for i in range(12)]
        per_step = []
        for step in range(4):
            before = stats["negotiations"]
            hs = [hvd.allreduce_async_(g.clone(), name=f"grad.{i}", op=hvd.Sum)
                  for i, g in enumerate(grads)]
            outs = [hvd.synchronize(h) for h in hs]
            assert all(torch.equal(o, g * hvd.size()) for o, g in zip(outs, grads))
            per_step.append(stats["negotiations"] - before)
        return per_step, stats["max_fused"], stats["cached"]


def mismatches(comm):
    """Shape, ndim, dtype, op and root mismatches raise on every rank; the job goes on."""
    with horovod(comm):
        r = hvd.rank()
        errors = []
        cases = [
            lambda: hvd.allreduce(torch.ones([17 + r] * 3)),
            lambda: hvd.allreduce(torch.ones([17, 23 * 57] if r == 0 else [17, 23, 57])),
            lambda: hvd.allreduce(torch.ones(17, dtype=torch.int32 if r % 2 == 0 else torch.float32)),
            lambda: hvd.allreduce(torch.ones(5), op=hvd.Sum if r == 0 else hvd.Max),
            lambda: hvd.allgather(torch.ones(2, 3 + r)),
            lambda: hvd.broadcast(torch.ones(3), root_rank=r),
            lambda: hvd.reducescatter(torch.ones(6, 1 + r)),
        ]
        for case in cases:
            try:
                case()
                errors.append(None)
            except RuntimeError as exc:
                errors.append(type(exc).__name__)
        for bad in (lambda: hvd.broadcast(torch.ones(2), root_rank=hvd.size()),
                    lambda: hvd.alltoall(torch.empty(hvd.size() - 1), torch.ones(hvd.size(), dtype=torch.int32)),
                    lambda: hvd.alltoall(torch.empty(hvd.size()), torch.empty(hvd.size())),
                    lambda: hvd.reducescatter(torch.tensor(1.0))):
            try:
                bad()
                errors.append(None)
            except ValueError:
                errors.append("ValueError")
        # a name the response cache knows, then submitted with another shape on one rank
        for _ in range(3):
            hvd.allreduce(torch.ones(4), name="cached_one", op=hvd.Sum)
        try:
            hvd.allreduce(torch.ones(5 if r == 1 else 4), name="cached_one", op=hvd.Sum)
            errors.append(None)
        except RuntimeError as exc:
            errors.append(type(exc).__name__)
        again = hvd.allreduce(torch.ones(4), name="cached_one", op=hvd.Sum)[0].item()
        ok = hvd.allreduce(torch.ones(3), op=hvd.Sum)[0].item()
        return errors, ok == again == hvd.size()


def gather_scatter(comm):
    with horovod(comm):
        r, n = hvd.rank(), hvd.size()
        for dtype, dim in itertools.product(DTYPES, [1, 2, 3]):
            t = _tensor(dtype, dim, n=5) * 0 + r
            g = hvd.allgather(t)
            assert g.shape[0] == 5 * n and all(torch.equal(g[5 * q:5 * q + 5], t * 0 + q)
                                               for q in range(n))
            v = hvd.allgather(torch.full([r + 1] + [3] * (dim - 1), r, dtype=dtype))
            assert v.shape[0] == n * (n + 1) // 2
            for q in range(n):
                lo = q * (q + 1) // 2
                assert torch.equal(v[lo:lo + q + 1].float(),
                                   torch.full([q + 1] + [3] * (dim - 1), float(q)))
            b = hvd.broadcast(t, root_rank=n - 1)
            assert torch.equal(b, t * 0 + (n - 1)) and torch.equal(t, t * 0 + r)
            c = t.clone()
            hvd.broadcast_(c, root_rank=0)
            assert torch.equal(c, t * 0)
        # alltoall with splits: rank r sends q+1 rows to rank q
        splits = torch.tensor([q + 1 for q in range(n)], dtype=torch.int32)
        rows = torch.cat([torch.full((q + 1, 2), float(r * 10 + q)) for q in range(n)])
        out, recv = hvd.alltoall(rows, splits)
        assert recv.tolist() == [r + 1] * n
        want = torch.cat([torch.full((r + 1, 2), float(q * 10 + r)) for q in range(n)])
        assert torch.equal(out, want)
        even = hvd.alltoall(torch.arange(2 * n, dtype=torch.float32) + 100 * r)
        assert even.tolist() == [float(100 * q + 2 * r + k) for q in range(n) for k in range(2)]
        # reducescatter: the first dim0 % n ranks get one row more
        rs = hvd.reducescatter(torch.ones(2 * n + 1, 3) * (r + 1), op=hvd.Sum)
        assert rs.shape == (3 if r == 0 else 2, 3) and torch.all(rs == n * (n + 1) / 2)
        avg = hvd.reducescatter(torch.ones(n, 2) * (r + 1))
        assert torch.allclose(avg, torch.full((1, 2), (n + 1) / 2))
        return True


def gradients(comm):
    """Backward passes of the non-async ops, as Horovod defines them."""
    with horovod(comm):
        r, n = hvd.rank(), hvd.size()
        x = torch.ones(4, 3, requires_grad=True)
        hvd.allreduce(x, op=hvd.Sum).backward(torch.ones(4, 3))
        assert torch.equal(x.grad, torch.full((4, 3), float(n)))
        x = torch.ones(4, requires_grad=True)
        hvd.allreduce(x).backward(torch.ones(4))
        assert torch.equal(x.grad, torch.ones(4))
        x = torch.ones(r + 1, 2, requires_grad=True)
        g = hvd.allgather(x)
        g.backward(torch.ones_like(g) * 2)
        assert torch.equal(x.grad, torch.full((r + 1, 2), 2.0))
        x = torch.ones(3, requires_grad=True)
        hvd.broadcast(x, root_rank=0).backward(torch.ones(3))
        assert torch.equal(x.grad, torch.ones(3) * (1.0 if r == 0 else 0.0))
        x = torch.ones(n * 2, requires_grad=True)
        out = hvd.alltoall(x)
        out.backward(torch.arange(n * 2, dtype=torch.float32))
        assert x.grad.shape == (n * 2,)
        x = torch.ones(n * 2, 2, requires_grad=True)
        hvd.reducescatter(x, op=hvd.Sum).backward(torch.ones(2, 2))
        assert torch.equal(x.grad, torch.full((n * 2, 2), float(n)))
        xs = [torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)]
        sum(o.sum() for o in hvd.grouped_allreduce(xs, op=hvd.Sum)).backward()
        assert all(torch.equal(x.grad, torch.full_like(x, float(n))) for x in xs)
        return True


def join_allreduce(comm):
    """Ranks that joined contribute zeros; join() returns the last rank to join."""
    with horovod(comm):
        r, n = hvd.rank(), hvd.size()
        rets = []
        for first, caching, dtype in itertools.product(range(n), [False, True],
                                                       [torch.int32, torch.float32]):
            a, b = _tensor(dtype, 2, n=5), _tensor(dtype, 1, n=17)
            if caching:
                hvd.synchronize(hvd.allreduce_async(a, name="tensor_a", average=True))
                hvd.synchronize(hvd.allreduce_async(b, name="tensor_b", average=True))
            if r == first:
                ret = hvd.join()
            else:
                ha = hvd.allreduce_async(a, name="tensor_a", average=True)
                hb = hvd.allreduce_async(b, name="tensor_b", average=True)
                av, bv = hvd.synchronize(ha), hvd.synchronize(hb)
                ret = hvd.join()
                div = (lambda t: t.div(n, rounding_mode="trunc")) if dtype == torch.int32 \
                    else (lambda t: t / n)
                assert torch.allclose(av, div(a * (n - 1))) and torch.allclose(bv, div(b * (n - 1)))
            assert ret != first
            assert hvd.allgather_object(ret) == [ret] * n
            rets.append(ret)
        # a broadcast whose ranks disagree, an allgather, an alltoall, while one rank has
        # joined: they fail everywhere (Horovod's rules)
        cases = [lambda: hvd.broadcast(torch.ones(3), r, name="join_broadcast"),
                 lambda: hvd.allgather(torch.ones(3, 2), name="join_allgather"),
                 lambda: hvd.alltoall(torch.ones(n), name="join_alltoall")]
        for case, first in itertools.product(cases, range(n)):
            if r == first:
                ret = hvd.join()
            else:
                try:
                    case()
                    raise AssertionError("an op with a joined rank did not raise")
                except RuntimeError:
                    pass
                ret = hvd.join()
            assert ret != first
        return rets


def process_sets(comm):
    with horovod(comm):
        r, n = hvd.rank(), hvd.size()
        evens = hvd.add_process_set([q for q in range(n) if q % 2 == 0])
        odds = hvd.add_process_set([q for q in range(n) if q % 2 == 1])
        mine = evens if r % 2 == 0 else odds
        s = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, process_set=mine)
        want = float(sum(q for q in mine.ranks))
        g = hvd.allgather(torch.tensor([r]), process_set=mine)
        b = hvd.broadcast(torch.tensor([float(r)]), root_rank=0, process_set=mine)
        o = hvd.broadcast_object({"from": r}, root_rank=0, process_set=mine)
        hvd.barrier(process_set=mine)
        other = odds if mine is evens else evens
        try:
            hvd.allreduce(torch.ones(1), process_set=other)
            raised = False
        except ValueError:
            raised = True
        sizes = (evens.size(), odds.size(), mine.rank(), mine.included(), other.included())
        hvd.barrier()
        removed = hvd.remove_process_set(odds)
        hvd.barrier()
        return (s.item() == want, g.tolist() == mine.ranks, b.item() == mine.ranks[0],
                o == {"from": mine.ranks[0]}, raised, sizes, removed)


def state_broadcasts(comm):
    with horovod(comm):
        r = hvd.rank()
        torch.manual_seed(r)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
        opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        params = [p.detach().clone() for p in model.state_dict().values()]
        everyone = hvd.allgather_object([p.tolist() for p in params])
        state = opt.state_dict()
        lrs = hvd.allgather_object(opt.param_groups[0]["lr"])
        moments = hvd.allgather_object([s["exp_avg"].tolist() for s in state["state"].values()])
        fresh = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1 * (r + 1), momentum=0.9)
        hvd.broadcast_optimizer_state(fresh, root_rank=1)
        obj = hvd.broadcast_object({"rank": r, "t": torch.ones(2) * r}, root_rank=1)
        return (all(e == everyone[0] for e in everyone), len(set(lrs)) == 1,
                all(m == moments[0] for m in moments), fresh.param_groups[0]["lr"],
                obj["rank"], hvd.allgather_object(r))


def compression(comm):
    with horovod(comm):
        n = hvd.size()
        t = torch.linspace(-1, 1, 33, dtype=torch.float64)
        c, ctx = hvd.Compression.fp16.compress(t)
        assert c.dtype == torch.float16 and hvd.Compression.fp16.decompress(c, ctx).dtype == t.dtype
        out = hvd.allreduce(t, op=hvd.Sum, compression=hvd.Compression.fp16)
        ints = hvd.allreduce(torch.ones(3, dtype=torch.int64), op=hvd.Sum,
                             compression=hvd.Compression.fp16)
        return out.dtype == t.dtype and torch.allclose(out, t * n, atol=1e-2), ints.tolist()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def optimizer(comm, kw, passes=1):
    """DistributedOptimizer over N ranks with N shards == one process on the whole batch."""
    kw = dict(kw)
    if kw.pop("fp16", False):
        kw["compression"] = hvd.Compression.fp16
    with horovod(comm):
        r, n = hvd.rank(), hvd.size()
        torch.manual_seed(42)
        xs, ys = torch.randn(4, n * 4, 6), torch.randn(4, n * 4, 2)
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
        groups = kw.pop("groups", None)
        if groups == "list":
            groups = [list(model[0].parameters()), list(model[2].parameters())]
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       backward_passes_per_step=passes, groups=groups, **kw)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        for step in range(4):
            opt.zero_grad()
            for p in range(passes):
                part = slice(r * 4, r * 4 + 4)
                loss = ((model(xs[step, part]) - ys[step, part]) ** 2).mean() / passes
                loss.backward()
            opt.step()
        ref = _model()
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.5)
        for step in range(4):
            ropt.zero_grad()
            losses = [((ref(xs[step, q * 4:q * 4 + 4]) - ys[step, q * 4:q * 4 + 4]) ** 2).mean()
                      for q in range(n)]
            (sum(losses) / n).backward()
            ropt.step()
        tol = 1e-2 if "compression" in kw else 1e-5
        return all(torch.allclose(a, b, atol=tol) for a, b in zip(model.parameters(), ref.parameters()))


def optimizer_api(comm):
    with horovod(comm):
        model = _model()
        base = torch.optim.SGD(model.parameters(), lr=0.1)
        opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
        assert isinstance(opt, torch.optim.SGD)
        errors = []
        model(torch.randn(2, 6)).sum().backward()
        try:
            opt.zero_grad()
        except AssertionError:
            errors.append("zero_grad race")
        opt.synchronize()
        with opt.skip_synchronize():
            opt.step()
        opt.zero_grad()
        named = list(model.named_parameters())
        for bad in ([("a", named[0][1]), ("a", named[1][1])] + named[2:], named[:2], [named[0][1]]):
            try:
                hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=bad)
            except ValueError:
                errors.append("named_parameters")
        try:
            hvd.DistributedOptimizer(base, op=hvd.Sum, gradient_predivide_factor=2.0)
        except ValueError:
            errors.append("predivide")
        return errors


def sync_batch_norm(comm):
    """SyncBatchNorm on rank shards == BatchNorm on the whole batch (values and grads)."""
    with horovod(comm):
        r, n = hvd.rank(), hvd.size()
        torch.manual_seed(7)
        full = torch.randn(n * 3, 4, 5)
        bn = hvd.SyncBatchNorm(4)
        ref = torch.nn.BatchNorm1d(4)
        x = full[r * 3:r * 3 + 3].clone().requires_grad_(True)
        y = bn(x)
        (y * torch.arange(5.0)).sum().backward()
        xf = full.clone().requires_grad_(True)
        yf = ref(xf)
        (yf * torch.arange(5.0)).sum().backward()
        ok_y = torch.allclose(y, yf[r * 3:r * 3 + 3], atol=1e-5)
        ok_gx = torch.allclose(x.grad, xf.grad[r * 3:r * 3 + 3], atol=1e-4)
        gw = hvd.allreduce(bn.weight.grad, op=hvd.Sum)
        ok_gw = torch.allclose(gw, ref.weight.grad, atol=1e-4)
        ok_stats = torch.allclose(bn.running_mean, ref.running_mean, atol=1e-5) and \
            torch.allclose(bn.running_var, ref.running_var, atol=1e-5)
        bn.eval()
        ok_eval = torch.allclose(bn(x.detach()), ref.eval()(x.detach()), atol=1e-5)
        return ok_y, ok_gx, ok_gw, ok_stats, ok_eval


def timeline(comm, path):
    with horovod(comm, HOROVOD_TIMELINE=path + ".env"):   # from init(), rank 0 writes it
        hvd.allreduce(torch.ones(2), name="from_env")
    with horovod(comm):
        hvd.start_timeline(path, mark_cycles=True)
        hvd.allreduce(torch.tensor([1.0, 2.0, 3.0]), name="test_allreduce")
        hvd.allreduce(torch.tensor([1.0, 2.0]), name="test_allreduce_2")
        time.sleep(0.05)
        hvd.stop_timeline()
        return hvd.rank()


def optimizer_cases(comm):
    """test_torch.py's optimizer cases: forced allreduce of missing gradients over every
    torch optimizer, dynamic requires_grad, clipping after synchronize(), the
    step-after-synchronize warning, sparse gradients, default names."""
    import inspect
    import warnings

    import torch.nn.functional as F

    with horovod(comm):
        r = hvd.rank()
        x, y = torch.randn(16, 10), torch.randn(16, 4)

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1, self.fc2, self.fc3 = (torch.nn.Linear(10, 6), torch.nn.Linear(6, 4),
                                                torch.nn.Linear(4, 4))

            def forward(self, v):
                h = self.fc2(F.relu(self.fc1(v)))
                return h, self.fc3(F.relu(h))

        classes = sorted((c for c in torch.optim.Optimizer.__subclasses__()
                          if c.__module__.startswith("torch.optim")
                          and c not in (torch.optim.LBFGS, torch.optim.SparseAdam)
                          and c.__name__ != "Muon"),   # Muon: 2-D parameters only
                         key=lambda c: c.__name__)
        params = dict(lr=0.2, momentum=0.9, weight_decay=0.1, centered=True)
        forced = []
        for cls in classes:
            torch.manual_seed(0)
            model = Net()
            kw = {k: v for k, v in params.items() if k in inspect.signature(cls.__init__).parameters}
            opt = hvd.DistributedOptimizer(cls(model.parameters(), **kw),
                                           named_parameters=model.named_parameters())
            out1, out2 = model(x)
            loss = F.mse_loss(out1 if r == 0 else out2, y)   # rank 0 leaves fc3 without grads
            opt.zero_grad()
            loss.backward()
            opt.step()
            forced.append(hvd.allgather_object([p.detach().sum().item()
                                                for p in model.parameters()]))
        forced_same = all(all(v == f[0] for v in f) for f in forced)

        gen, disc = torch.nn.Conv2d(1, 4, 1), torch.nn.Conv2d(4, 1, 1)
        gopt = hvd.DistributedOptimizer(torch.optim.SGD(gen.parameters(), lr=0.1),
                                        named_parameters=gen.named_parameters(prefix="gen"))
        dopt = hvd.DistributedOptimizer(torch.optim.SGD(disc.parameters(), lr=0.1),
                                        named_parameters=disc.named_parameters(prefix="disc"))
        inp = torch.rand(1, 1, 8, 8)
        for _ in range(3):
            for train_gen in (True, False):
                for p in gen.parameters():
                    p.requires_grad_(train_gen)
                for p in disc.parameters():
                    p.requires_grad_(not train_gen)
                gopt.zero_grad()
                dopt.zero_grad()
                disc(gen(inp)).sum().backward()
                (gopt if train_gen else dopt).step()

        model = torch.nn.Linear(1, 1)
        model.weight = torch.nn.Parameter(torch.zeros(1, 1) + 0.5)
        model.bias = torch.nn.Parameter(torch.zeros(1))
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        F.mse_loss(model(torch.ones(1, 1)), torch.ones(1, 1)).backward()
        opt.synchronize()
        prior = model.weight.grad.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        clipped = abs(prior) > abs(model.weight.grad.item())
        with opt.skip_synchronize():
            opt.step()
        opt.zero_grad()
        F.mse_loss(model(torch.ones(1, 1)), torch.ones(1, 1)).backward()
        opt.synchronize()
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            opt.step()
        warned = any("skip_synchronize" in str(w.message) for w in ws)

        sparse_ok = []
        for as_dense in (False, True):
            torch.manual_seed(0)
            emb = torch.nn.Embedding(10, 3, sparse=True)
            sopt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1),
                                            sparse_as_dense=as_dense)
            idx = torch.LongTensor([[1, 2, 4, 5], [4, 3, 2, 9]] if r == 0 else [[1, 3, 4], [4, 7, 9]])
            sopt.zero_grad()
            emb(idx).sum().backward()
            sopt.step()
            sparse_ok.append(hvd.allgather_object(emb.weight.detach().sum().item()))
        tensors = [torch.rand(d, 10) * (torch.rand(d, 10) > 0.8) for d in (17, 32, 5)]
        dense = [hvd.allreduce(t) for t in tensors]
        handles = [hvd.sparse_allreduce_async(t.to_sparse(), name=f"sp{i}", op=hvd.Average)
                   for i, t in enumerate(tensors)]
        sparse_match = all(torch.allclose(d, h().to_dense(), atol=1e-6)
                           for d, h in zip(dense, handles))
        return (forced_same, len(forced), clipped, warned,
                all(len(set(s)) == 1 for s in sparse_ok), sparse_match)


def optimizer_process_set(comm):
    """A DistributedOptimizer on a process set averages among its members only."""
    with horovod(comm):
        r = hvd.rank()
        evens = hvd.add_process_set([q for q in range(hvd.size()) if q % 2 == 0])
        odds = hvd.add_process_set([q for q in range(hvd.size()) if q % 2 == 1])
        mine = evens if r % 2 == 0 else odds
        model = torch.nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            model.weight.fill_(0.0)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                       named_parameters=model.named_parameters(),
                                       process_set=mine)
        (model(torch.ones(1, 2)) * (r + 1)).sum().backward()
        opt.step()
        want = -sum(q + 1 for q in mine.ranks) / len(mine.ranks)
        return torch.allclose(model.weight, torch.full((1, 2), float(want)))


def one_rank_shuts_down(comm):
    """When one rank calls shutdown(), the others' operations raise, never hang."""
    hvd.init(comm=comm)
    try:
        if hvd.rank() == 0:
            return "shut down"
        time.sleep(0.3)
        try:
            hvd.allreduce(torch.ones(3), name="after_shutdown")
            return "no error"
        except hvd.HorovodInternalError as exc:
            return "shut down" if "shut down" in str(exc) else str(exc)
    finally:
        hvd.shutdown()


def init_with_ranks(comm):
    """hvd.init(comm=[0, 2]): Horovod on those world ranks only (a job of its own)."""
    try:
        hvd.init(comm=[0, 2])
    except ValueError as exc:
        return "not a member" if "not in the ranks" in str(exc) else str(exc)
    try:
        return (hvd.rank(), hvd.size(), hvd.allreduce(torch.ones(1), op=hvd.Sum).item())
    finally:
        hvd.shutdown()


def fused_odd_sizes(comm):
    """Fused buffers of odd lengths above 1024 elements (the coordinator pads them to
    a few plan sizes): every op's result is exact and the padding never shows."""
    with horovod(comm, HOROVOD_CYCLE_TIME=20):
        r, n = hvd.rank(), hvd.size()
        stats = hvd._runtime.current().coordinator.stats
        ops = [hvd.Sum, hvd.Min, hvd.Max, hvd.Product, hvd.Average]
        for step in range(3):                    # the first negotiates, later ones are cached
            fused_before = stats["max_fused"]
            hs, want = [], []
            for i in range(37):
                op = ops[i % len(ops)]
                size = 301 + 13 * (i % 4)        # about 2,400 elements fused per op
                base = torch.arange(size, dtype=torch.float64) % 7 + 1
                mine = base * (r + 1) if op != hvd.Product else base ** 0 * (1 + (r == i % n))
                alls = [base * (q + 1) if op != hvd.Product else base ** 0 * (1 + (q == i % n))
                        for q in range(n)]
                stack = torch.stack(alls)
                want.append({hvd.Sum: stack.sum(0), hvd.Min: stack.min(0).values,
                             hvd.Max: stack.max(0).values, hvd.Product: stack.prod(0),
                             hvd.Average: stack.mean(0)}[op])
                hs.append(hvd.allreduce_async_(mine, name=f"odd.{i}", op=op))
            for h, w in zip(hs, want):
                got = hvd.synchronize(h)
                assert torch.allclose(got, w), (step, got[:4], w[:4])
        return stats["max_fused"], fused_before


def optimizer_steady_steps(comm):
    """DistributedOptimizer's steady steps: after the first step every gradient is a
    response-cache hit (no full negotiation) and fusion packs several per buffer."""
    with horovod(comm, HOROVOD_CYCLE_TIME=5):
        stats = hvd._runtime.current().coordinator.stats
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(10)])
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                       named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        x = torch.randn(4, 8)
        per_step, cached = [], []
        for _ in range(5):
            before, hits = stats["negotiations"], stats["cached"]
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            per_step.append(stats["negotiations"] - before)
            cached.append(stats["cached"] - hits)
        return per_step, cached, stats["max_fused"]
