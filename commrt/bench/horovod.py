"""Horovod-style synthetic training: commrt.horovod (fusion on/off, fp16) beside torch DDP.

    python -m commrt.bench horovod [--sizes 2,4] [--rounds 3] [--steps 20] [--warmup 3]
                                   [--batch 16] [--models tiny,cnn] [--json FILE]
                                   [--variant LABEL:K=V[,K=V]]... [--blocks K]

As Horovod's examples/pytorch/pytorch_synthetic_benchmark.py: CNNs defined
here (no torchvision), synthetic images, one thread per rank.  ``cnn`` has
12 conv+BatchNorm blocks of 32 channels on 3x32x32 images (~40 tensors),
``many`` 48 blocks of 16 channels on 3x8x8 images (~150 small tensors),
``tiny`` the same network on 3x4x4 images (~150 small tensors for the least
compute: the step is mostly communication, fusion's case).  Per model, round and
world size, interleaved: commrt.horovod's DistributedOptimizer
with fusion (default HOROVOD_FUSION_THRESHOLD), without (threshold 0), with
fusion and Compression.fp16, and torch DistributedDataParallel over Gloo
(the Horovod package itself does not build here), each a fresh job started
by commrt-launch.  The figure is images per second over all ranks, median
over rounds [min-max]; ratios are against DDP and fusion off.  A --variant
adds a column ``fusion+LABEL``: fusion with extra rank environment, run in the
same interleaved rounds (an A/B of a knob against its peers in one run).
A second table gives rank 0's coordinator counts per timed step: rounds, full
negotiations (zero once the response cache is warm), data all-reduces (fused
buffers or lone tensors) and tensors.

--blocks K runs every mode in one job per model, world size and round instead:
K blocks of --steps timed steps per mode, the modes in turn (reversed every
other block), Horovod started with the mode's environment for its block and
shut down after it.  Jobs differ from one another (where the scheduler puts
the ranks, what else the host runs) far more than the modes do; within one
job the modes share all that, so the ratio columns are then the median
[min-max] of the jobs' own ratios.
"""
import argparse
import json
import socket
import subprocess
import sys
import time

from commrt.bench._stats import Summary, table

MODES = ("fusion", "nofusion", "fp16", "ddp")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_one(model, mode, n, args):
    base, _, label = mode.partition("+")
    extra = [a for kv in (args.variants[label] if label else ()) for a in ("--env", kv)]
    cmd = [sys.executable, "-m", "commrt.launcher", "-n", str(n), "--no-prefix",
           "--env", "OMP_NUM_THREADS=1", "--env", "MASTER_ADDR=127.0.0.1",
           "--env", f"MASTER_PORT={_free_port()}", *extra,
           "-m", "commrt.bench._horovod_worker", base, model, str(args.batch),
           str(args.steps), str(args.warmup)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            return rec["imgs_per_s"], rec.get("per_step")
    raise RuntimeError(f"{model} {mode} at N={n} failed (exit {out.returncode}):\n"
                       f"{(out.stdout + out.stderr)[-2000:]}")


def run_job(model, modes, n, args):
    """--blocks: every mode in one job (_horovod_worker.main_blocks) -> {mode: (imgs/s,
    per_step counts or None)}."""
    variants = [f"{label}:{','.join(env)}" for label, env in args.variants.items()]
    cmd = [sys.executable, "-m", "commrt.launcher", "-n", str(n), "--no-prefix",
           "--env", "OMP_NUM_THREADS=1", "--env", "MASTER_ADDR=127.0.0.1",
           "--env", f"MASTER_PORT={_free_port()}",
           "-m", "commrt.bench._horovod_worker", "--blocks", str(args.blocks),
           ",".join(modes), model, str(args.batch), str(args.steps), str(args.warmup),
           *variants]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            return {m: (r["imgs_per_s"], r.get("per_step")) for m, r in rec.items()}
    raise RuntimeError(f"{model} at N={n} ({','.join(modes)}) failed (exit {out.returncode}):"
                       f"\n{(out.stdout + out.stderr)[-2000:]}")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m commrt.bench horovod", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="2,4")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--models", default="tiny,cnn", help="tiny, many and/or cnn")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--blocks", type=int, default=0, metavar="K",
                   help="run every mode in one job per round, K blocks of --steps each, "
                        "interleaved (ratios measured within a job); 0: a job per mode")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--variant", action="append", default=[], metavar="LABEL:K=V[,K=V]",
                   help="also run fusion with this rank environment, interleaved "
                        "(repeatable), e.g. spin50:COMMRT_SPIN_MAX_US=50")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    args.variants = {}
    for v in args.variant:
        label, sep, env = v.partition(":")
        if not sep or not label or "+" in label or any("=" not in kv for kv in env.split(",")):
            p.error(f"--variant wants LABEL:K=V[,K=V], got {v!r}")
        args.variants[label] = env.split(",")
        modes.append("fusion+" + label)
    models = [m for m in args.models.split(",") if m]
    keys = [(mo, n, m) for mo in models for n in sizes for m in modes]
    samples = {k: [] for k in keys}
    per_step = {k: [] for k in keys}             # rank 0's coordinator counts per step
    ratios = {}                                  # --blocks: (model, n, "a/b") -> per-job ratios
    t0 = time.monotonic()
    for r in range(args.rounds):
        for mo in models:
            for n in sizes:
                order = modes if r % 2 == 0 else list(reversed(modes))   # interleaved
                if args.blocks > 0:
                    got = run_job(mo, order, n, args)
                else:
                    got = {m: run_one(mo, m, n, args) for m in order}
                for m, (imgs, counts) in got.items():
                    samples[(mo, n, m)].append(imgs)
                    if counts is not None:
                        per_step[(mo, n, m)].append(counts)
                if args.blocks > 0:
                    for a, b in (("fusion", "ddp"), ("fusion", "nofusion")):
                        if a in got and b in got:
                            ratios.setdefault((mo, n, f"{a}/{b}"), []).append(
                                got[a][0] / got[b][0])
        # progress, and the samples so far, so a run cut short still leaves its figures
        print(f"round {r + 1}/{args.rounds} done at {time.monotonic() - t0:.0f} s",
              file=sys.stderr, flush=True)
        if args.json:
            _dump(args.json, samples, per_step)
    rows = []
    for mo in models:
        for n in sizes:
            s = {m: Summary(samples[(mo, n, m)]) for m in modes}
            if args.blocks > 0:              # the median of the jobs' own ratios [min-max]
                cells = [_job_ratio(ratios.get((mo, n, k))) for k in ("fusion/ddp",
                                                                      "fusion/nofusion")]
            else:
                cells = [_ratio(s.get("fusion"), s.get("ddp")),
                         _ratio(s.get("fusion"), s.get("nofusion"))]
            rows.append([mo, str(n)] + [s[m].cell() for m in modes] + cells)
    how = (f"{args.blocks} blocks of {args.steps} steps per mode in one job per round, ratios "
           f"taken within each job" if args.blocks > 0 else f"{args.steps} steps")
    print(f"images/s over all ranks, batch {args.batch} per rank, {how}, "
          f"{args.rounds} rounds (median [min-max])")
    print(table(["model", "N"] + modes + ["fusion/ddp", "fusion/off"], rows, "ll" + "r" * (len(modes) + 2)))
    counted = [k for k in keys if per_step[k]]
    if counted:
        print("\ncommrt.horovod's coordinator per step (rank 0, median over rounds): rounds, "
              "full negotiations, data all-reduces, tensors")
        crow = []
        for mo, n, m in counted:
            cs = per_step[(mo, n, m)]
            crow.append([mo, str(n), m] + [f"{Summary([c[f] for c in cs]).median:.1f}"
                                           for f in ("rounds", "negotiations", "buffers",
                                                     "tensors")])
        print(table(["model", "N", "mode", "rounds", "negotiations", "all-reduces", "tensors"],
                    crow, "lll" + "r" * 4))
    if args.json:
        _dump(args.json, samples, per_step)
    return 0


def _dump(path, samples, per_step):
    # samples in round order: with --blocks, sample i of every mode is job i's
    out = {f"{mo}/{n}/{m}": dict(Summary(v).as_dict(), samples=v)
           for (mo, n, m), v in samples.items() if v}
    for (mo, n, m), cs in per_step.items():
        if cs:
            out[f"{mo}/{n}/{m}"]["per_step"] = cs
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def _job_ratio(values):
    if not values:
        return "n/a"
    s = Summary(values)
    return f"{s.median:.2f} [{s.min:.2f}-{s.max:.2f}]"


def _ratio(a, b):
    if a is None or b is None or a.median is None or not b.median:
        return "n/a"
    return f"{a.median / b.median:.2f}"
