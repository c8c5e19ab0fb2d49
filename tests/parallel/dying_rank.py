"""Launched by test_data_parallel_failure.py: data-parallel training in which
rank DIE_RANK exits abruptly in the middle of epoch 1."""
import os
import sys

import commrt
from commrt import nn, optim
from commrt.data import DataLoader, load_digits
from commrt.nn import functions as F
from commrt.parallel import DistributedOptimizer, DistributedSampler, broadcast_parameters

DIE_RANK, DIE_STEP = int(sys.argv[1]), int(sys.argv[2])

comm = commrt.init()
nn.manual_seed(0)
model = nn.LeNet(in_channels=1, num_classes=10, image_size=8, channels=(8, 16), kernel_size=3,
                 padding=(1, 1), hidden=(32,))
broadcast_parameters(model, comm=comm)
opt = DistributedOptimizer(optim.SGD(model.parameters(), lr=0.05), comm)
train = load_digits("train")
loader = DataLoader(train, 16, sampler=DistributedSampler(train, comm))
for epoch in range(3):
    loader.set_epoch(epoch)
    for step, (x, y) in enumerate(loader):
        if comm.rank == DIE_RANK and epoch == 1 and step == DIE_STEP:
            print(f"rank {comm.rank} dies at epoch {epoch} step {step}", flush=True)
            os._exit(7)
        loss = F.cross_entropy(model(nn.Tensor(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if comm.rank == 0:
        print(f"epoch {epoch} loss {loss.item():.3f}", flush=True)
print("finished", flush=True)
