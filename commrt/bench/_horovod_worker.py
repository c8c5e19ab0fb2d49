"""One rank of `python -m commrt.bench horovod` (started by commrt-launch).

    python -m commrt.bench._horovod_worker MODE MODEL BATCH STEPS WARMUP

MODE: fusion | nofusion | fp16 (commrt.horovod.torch's DistributedOptimizer) or
ddp (torch DistributedDataParallel over Gloo, the reference).  Rank 0 prints
one JSON line: {"mode", "size", "imgs_per_s"} (images of all ranks per second),
and for commrt.horovod's modes "per_step": rank 0's coordinator counts per timed
step (rounds, full negotiations, data all-reduces, tensors reduced).
"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

from commrt.bench._launch import end_gloo_rank


class SmallCNN(torch.nn.Module):
    """A CNN of 12 conv+BN blocks of 32 channels on 3x32x32 images (~40 tensors)."""

    def __init__(self, blocks=12, width=32, classes=10):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, width, 3, padding=1)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Conv2d(width, width, 3, padding=1, bias=False),
                                torch.nn.BatchNorm2d(width), torch.nn.ReLU())
            for _ in range(blocks))
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x):
        x = F.relu(self.stem(x))
        for i, b in enumerate(self.blocks):
            x = b(x) + x
            if i in (3, 7):
                x = F.max_pool2d(x, 2)
        return self.head(x.mean((2, 3)))


class ManyCNN(SmallCNN):
    """Many tiny tensors for little compute (fusion's case): 48 blocks of 16 channels
    (~150 tensors), fed 3x8x8 images."""

    def __init__(self):
        super().__init__(blocks=48, width=16)

    def forward(self, x):
        x = F.relu(self.stem(x))
        for b in self.blocks:
            x = b(x) + x
        return self.head(x.mean((2, 3)))


MODELS = {"cnn": SmallCNN, "many": ManyCNN, "tiny": ManyCNN}
# tiny: ManyCNN's ~150 tensors on 4x4 images, a quarter of its compute, so the
# step is mostly communication: where fusion matters most
IMAGE = {"cnn": 32, "many": 8, "tiny": 4}


COUNTS = ("rounds", "negotiations", "buffers", "tensors")


def _counts(mode):
    """The coordinator's counters (rounds, full negotiations, data all-reduces of
    fused buffers or lone tensors, tensors) now, or None for DDP."""
    if mode == "ddp":
        return None
    from commrt.horovod import _runtime

    stats = _runtime.current().coordinator.stats
    return {k: stats[k] for k in COUNTS}


def _time_steps(model, opt, data, target, warmup, steps, sync, mode):
    """(seconds, counts): `steps` training steps timed after `warmup` untimed ones,
    the ranks aligned by sync() before and after, and the coordinator's counters
    over them (None for DDP)."""
    def step():
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()

    for _ in range(warmup):
        step()
    sync()
    before = _counts(mode)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    elapsed = time.perf_counter() - t0
    if before is None:
        return elapsed, None
    after = _counts(mode)
    return elapsed, {k: after[k] - before[k] for k in COUNTS}


def main(argv):
    if argv[0] == "--blocks":
        return main_blocks(argv[1:])
    mode, model_name, batch, steps, warmup = argv[0], argv[1], *map(int, argv[2:5])
    torch.set_num_threads(1)
    if mode == "nofusion":
        os.environ["HOROVOD_FUSION_THRESHOLD"] = "0"
    torch.manual_seed(0)
    model = MODELS[model_name]()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if mode == "ddp":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        model = torch.nn.parallel.DistributedDataParallel(model)
        sync = dist.barrier
    else:
        import commrt.horovod.torch as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        comp = hvd.Compression.fp16 if mode == "fp16" else hvd.Compression.none
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       compression=comp)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        sync = hvd.barrier
    data = torch.randn(batch, 3, IMAGE[model_name], IMAGE[model_name])
    target = torch.randint(0, 10, (batch,))

    elapsed, counts = _time_steps(model, opt, data, target, warmup, steps, sync, mode)
    if rank == 0:
        out = {"mode": mode, "size": size, "imgs_per_s": batch * size * steps / elapsed}
        if counts is not None:
            # the closing barrier's round included: per step, it is a 1/steps share
            out["per_step"] = {k: v / steps for k, v in counts.items()}
        print(json.dumps(out), flush=True)
    if mode != "ddp":
        hvd.shutdown()
    else:
        end_gloo_rank()


def main_blocks(argv):
    """Every mode in one job, in blocks: ``--blocks K MODES MODEL BATCH STEPS WARMUP
    [LABEL:K=V[,K=V]]...``.  Each mode runs K blocks of STEPS timed steps (after
    WARMUP untimed ones), in the order of MODES, then reversed, and so on: the modes
    share the job's processes, their placement on the cores and the host's state of
    the moment, so their ratio is measured within one job.  A commrt.horovod block
    starts Horovod with its mode's environment (and the variant's) and shuts it down
    after; DDP's gloo group stays up, idle while Horovod runs (it has no thread that
    polls).  Rank 0 prints one JSON line: per mode, imgs_per_s over its blocks and,
    for commrt.horovod's modes, per_step coordinator counts."""
    import torch.distributed as dist

    blocks, modes, model_name = int(argv[0]), argv[1].split(","), argv[2]
    batch, steps, warmup = map(int, argv[3:6])
    variants = {}
    for v in argv[6:]:
        label, _, env = v.partition(":")
        variants[label] = dict(kv.split("=", 1) for kv in env.split(","))
    torch.set_num_threads(1)
    data = torch.randn(batch, 3, IMAGE[model_name], IMAGE[model_name])
    target = torch.randint(0, 10, (batch,))
    runs = {}                                    # mode -> (model, optimizer)
    timed = {m: [0, 0.0] for m in modes}         # mode -> [steps, seconds]
    counts = {m: dict.fromkeys(COUNTS, 0) for m in modes if m != "ddp"}
    if "ddp" in modes:
        dist.init_process_group("gloo")
    hvd = None
    rank = size = None
    for b in range(blocks):
        for mode in (modes if b % 2 == 0 else modes[::-1]):
            base, _, label = mode.partition("+")
            if base == "ddp":
                if mode not in runs:
                    torch.manual_seed(0)
                    model = torch.nn.parallel.DistributedDataParallel(MODELS[model_name]())
                    runs[mode] = (model, torch.optim.SGD(model.parameters(), lr=0.01,
                                                         momentum=0.9))
                rank, size, sync = dist.get_rank(), dist.get_world_size(), dist.barrier
            else:
                env = dict(variants.get(label, {}))
                if base == "nofusion":
                    env["HOROVOD_FUSION_THRESHOLD"] = "0"
                saved = {k: os.environ.get(k) for k in env}
                os.environ.update(env)
                import commrt.horovod.torch as hvd

                hvd.init()
                rank, size, sync = hvd.rank(), hvd.size(), hvd.barrier
                if mode not in runs:
                    torch.manual_seed(0)
                    model = MODELS[model_name]()
                    comp = hvd.Compression.fp16 if base == "fp16" else hvd.Compression.none
                    opt = hvd.DistributedOptimizer(
                        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                        named_parameters=model.named_parameters(), compression=comp)
                    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
                    runs[mode] = (model, opt)
            model, opt = runs[mode]

            elapsed, delta = _time_steps(model, opt, data, target, warmup, steps, sync, base)
            timed[mode][0] += steps
            timed[mode][1] += elapsed
            if base != "ddp":
                for k, v in delta.items():
                    counts[mode][k] += v
                hvd.shutdown()
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
    if rank == 0:
        out = {}
        for m in modes:
            n, secs = timed[m]
            out[m] = {"imgs_per_s": batch * size * n / secs}
            if m in counts:
                out[m]["per_step"] = {k: v / n for k, v in counts[m].items()}
        print(json.dumps(out), flush=True)
    if "ddp" in modes:
        dist.destroy_process_group()
        end_gloo_rank()


if __name__ == "__main__":
    main(sys.argv[1:])
