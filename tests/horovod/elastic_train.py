"""An elastic job (run under commrt-launch --min-np/--max-np/--host-discovery-script).

kill: rank 1 kills itself with SIGKILL in the middle of epoch 1 of generation 0.
grow: in the middle of epoch 1 of generation 0, rank 0 writes one more slot into
the discovery file (HOSTS): the driver starts a worker, and every rank commits
until that commit raises HostsUpdatedInterrupt (at most 150 s).

Every batch, the ranks Sum-allreduce a one-hot count of the samples they
processed into state.counts (committed with the model): after the run,
counts[e][i] is how often sample i was processed in epoch e by work that
survived, which ElasticSampler's contract says is exactly 1.
Usage: elastic_train.py RESULT.json kill|grow [HOSTS]
"""
import json
import os
import signal
import sys
import time

import torch

import commrt.horovod.torch as hvd
from commrt.horovod import elastic as hvd_elastic

N, BATCH, EPOCHS = 72, 3, 3     # 2 or 3 ranks: what remains always divides

hvd.init()
torch.manual_seed(0)
data = torch.randn(N, 4)
target = data.sum(1, keepdim=True)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(list(range(N)), shuffle=True, seed=1)


MODE = sys.argv[2]


def event(state):
    if MODE == "kill" and hvd.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if MODE == "grow":
        if hvd.rank() == 0:
            with open(sys.argv[3], "w") as f:
                f.write("localhost:3\n")
        deadline = time.monotonic() + 150       # a new worker imports torch: slow when loaded
        while time.monotonic() < deadline:
            state.commit()                    # raises HostsUpdatedInterrupt once grown
            time.sleep(0.1)
        raise SystemExit("the driver did not add the new slot's worker")


@hvd.elastic.run
def train(state):
    while state.epoch < EPOCHS:
        idx = list(state.sampler)
        for b in range(0, len(idx), BATCH):
            if hvd_elastic.current_generation() == 0 and state.epoch == 1 and b == 3 * BATCH:
                event(state)
            chunk = idx[b:b + BATCH]
            opt.zero_grad()
            loss = ((model(data[chunk]) - target[chunk]) ** 2).mean()
            loss.backward()
            opt.step()
            seen = torch.zeros(N)
            seen[chunk] = 1.0
            state.counts[state.epoch] += hvd.allreduce(seen, op=hvd.Sum, name="seen")
            state.sampler.record_batch(b // BATCH, BATCH)
            state.commit()
        state.epoch += 1
        state.sampler.set_epoch(state.epoch)
        state.commit()
    return loss.item()


state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0,
                               counts=torch.zeros(EPOCHS, N))
resets = []
state.register_reset_callbacks([lambda: resets.append(hvd.size())])
loss = train(state)
if hvd.rank() == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"counts": state.counts.tolist(), "size": hvd.size(), "loss": loss,
                   "generation": hvd_elastic.current_generation(),
                   "resets": resets}, f)
print(f"rank {hvd.rank()} done in generation {hvd_elastic.current_generation()}")
hvd.shutdown()
