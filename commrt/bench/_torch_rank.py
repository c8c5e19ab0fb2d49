"""One rank of ``python -m commrt.bench torch``: torch.distributed on one backend.

``python -m commrt.bench._torch_rank --rank R --world N --init file://... --backend B
--spec FILE --out DIR``: the collectives of the spec through torch.distributed
(float32 CPU tensors, blocking calls, slices between barriers, median of the
slowest rank's average), DDP training steps on a CNN and an MLP, and on commrt
also the native commrt call (the same buffer, commrt's own API) and torch's
dispatch into a do-nothing Python process group (the floor any Python backend
pays).
"""
import datetime
import os
import sys
import time

from commrt.bench._launch import end_gloo_rank, rank_args, write_json

SLICES = 5


class _Noop:
    """A Python ProcessGroup whose every call returns a completed Work."""

    @staticmethod
    def make():
        import torch
        import torch.distributed as dist

        class NoopPG(dist.ProcessGroup):
            def __init__(self, rank, size):
                super().__init__(rank, size)
                fut = torch.futures.Future()
                fut.set_result(None)
                self._fut = fut

            def getBackendName(self):
                return "noop"

            def allreduce(self, tensors, opts=None):
                return _done(self._fut)

        class Done(dist.Work):
            def __init__(self, fut):
                super().__init__()
                self.fut = fut

            def wait(self, timeout=None):
                return True

            def get_future(self):
                return self.fut

        def _done(fut):
            return Done(fut)

        def create(opts, _options=None):
            return NoopPG(opts.group_rank, opts.group_size)

        if "COMMRT_BENCH_NOOP" not in dist.Backend._plugins:
            dist.Backend.register_backend("commrt_bench_noop", create, extended_api=True,
                                          devices=["cpu"])
        return create


def _timed(fn, target_s, barrier, agree, max_iters):
    return _timed_together({"fn": fn}, target_s, barrier, agree, max_iters)["fn"]


def _timed_together(fns, target_s, barrier, agree, max_iters):
    """{name: (median time per call, calls)} of each function, the functions taking
    turns slice by slice between barriers, so that the host's state and what ran
    just before in this process are alike for all of them."""
    per = {}
    for name, fn in fns.items():
        fn()
        fn()
        barrier()
        t0 = time.perf_counter()
        fn()
        est = agree(time.perf_counter() - t0)
        n = int(min(max_iters, max(3, target_s / max(est, 1e-7))))
        per[name] = max(1, -(-n // SLICES))
    ts = {name: [] for name in fns}
    for _ in range(SLICES):
        for name, fn in fns.items():
            barrier()
            t0 = time.perf_counter()
            for _ in range(per[name]):
                fn()
            ts[name].append(agree((time.perf_counter() - t0) / per[name]))
    return {name: (sorted(v)[len(v) // 2], per[name] * SLICES) for name, v in ts.items()}


def _collective(dist, torch, kind, nbytes, rank, n):
    count = max(1, nbytes // 4)
    if kind == "all_reduce":
        t = torch.zeros(count)
        return lambda: dist.all_reduce(t)
    if kind == "broadcast":
        t = torch.zeros(count)
        return lambda: dist.broadcast(t, 0)
    block = max(1, count // n)
    big, small = torch.zeros(block * n), torch.zeros(block)
    if kind == "all_gather_into_tensor":
        return lambda: dist.all_gather_into_tensor(big, small)
    if kind == "reduce_scatter_tensor":
        return lambda: dist.reduce_scatter_tensor(small, big)
    if kind == "all_to_all_single":
        out = torch.zeros(block * n)
        return lambda: dist.all_to_all_single(out, big)
    raise ValueError(kind)


def _model(torch, name):
    nn = torch.nn
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(32 * 8 * 8, 10)), (8, 3, 32, 32)
    # 4.2 M parameters: 1024-2048-1024-10, batch 8
    return nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 1024), nn.ReLU(),
                         nn.Linear(1024, 10)), (8, 1024)


def _ddp_step(torch, dist, name):
    torch.manual_seed(0)
    model, shape = _model(torch, name)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(shape)

    def step():
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
    params = sum(p.numel() for p in model.parameters())
    return step, params


def main(argv=None):
    p_args, spec = _parse(argv)
    args = p_args
    import torch
    import torch.distributed as dist

    import commrt.torch  # noqa: F401

    torch.set_num_threads(1)
    from commrt.bench._coll import bind

    bind(args.rank, args.world)
    dist.init_process_group(args.backend, init_method=args.init, rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=300))
    x = torch.zeros(1, dtype=torch.float64)

    def agree(v):
        x[0] = v
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return float(x[0])

    barrier = dist.barrier
    rows = []
    target, max_iters = spec.get("target_s", 0.1), spec.get("max_iters", 2000)
    for kind in spec["kinds"]:
        for nbytes in spec["sizes"]:
            fn = _collective(dist, torch, kind, nbytes, args.rank, args.world)
            t, iters = _timed(fn, target, barrier, agree, max_iters)
            rows.append({"kind": kind, "bytes": nbytes, "time_s": t, "iters": iters})
    if spec.get("dispatch") and args.backend == "commrt":
        import numpy as np

        pg = dist.distributed_c10d._get_default_group()
        comm = pg.comm
        a = np.zeros(2, np.float32)
        _Noop.make()
        noop = dist.new_group(backend="commrt_bench_noop")
        tt, tn, tb = torch.zeros(2), torch.zeros(2), torch.zeros(2)
        blocking = dist.AllreduceOptions()
        blocking.asyncOp = False
        # in turns: the target compares three of them under one state; the
        # fourth, the backend's method called straight from Python (no torch code
        # around it), splits the difference between torch's share and the backend's
        got = _timed_together({"dispatch_all_reduce": lambda: dist.all_reduce(tt),
                               "native_all_reduce": lambda: comm.all_reduce(a),
                               "noop_dispatch": lambda: dist.all_reduce(tn, group=noop),
                               "backend_all_reduce": lambda: pg.allreduce([tb], blocking)},
                              target, barrier, agree, max_iters)
        for kind, (t, iters) in got.items():
            rows.append({"kind": kind, "bytes": 8, "time_s": t, "iters": iters})
    for name in spec.get("models", []):
        step, params = _ddp_step(torch, dist, name)
        t, iters = _timed(step, spec.get("ddp_target_s", 1.0), barrier, agree,
                          spec.get("ddp_max_iters", 50))
        rows.append({"kind": f"ddp_{name}", "bytes": params * 4, "time_s": t, "iters": iters})
    dist.destroy_process_group()
    write_json(os.path.join(args.out, f"rank{args.rank}.json"),
               {"rank": args.rank, "backend": args.backend, "rows": rows})
    if args.backend == "gloo":
        end_gloo_rank()
    return 0


def _parse(argv):
    argv = list(sys.argv[1:] if argv is None else argv)
    backend = "commrt"
    if "--backend" in argv:
        i = argv.index("--backend")
        backend = argv[i + 1]
        del argv[i:i + 2]
    args, spec = rank_args(argv, ranked=True)
    args.backend = backend
    return args, spec


if __name__ == "__main__":
    sys.exit(main())
