"""Rank 2 of 3 dies (os._exit: the kernel closes its sockets, as at a crash) in the
middle of a stream of allreduces; the others must raise HorovodInternalError
within 2 s of its death.  Usage: dead_peer.py DIR (rank 2 writes DIR/death)."""
import os
import sys
import time

import torch

import commrt.horovod.torch as hvd

hvd.init()
death = os.path.join(sys.argv[1], "death")
for i in range(1000):
    if hvd.rank() == 2 and i == 20:
        with open(death + ".tmp", "w") as f:
            f.write(repr(time.time()))
        os.rename(death + ".tmp", death)
        os._exit(0)
    try:
        hvd.allreduce(torch.ones(1000), name=f"step.{i % 4}")
    except hvd.HorovodInternalError as exc:
        seen = time.time()
        while not os.path.exists(death):
            time.sleep(0.01)
        died = float(open(death).read())
        print(f"rank {hvd.rank()} raised HorovodInternalError {seen - died:.3f} s after the "
              f"death: {str(exc)[:120]}")
        break
else:
    print(f"rank {hvd.rank()} never saw the death")
