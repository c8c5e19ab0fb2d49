"""The issue's snippet, with only Horovod's import line changed, in a tiny training loop
(run under commrt-launch -np 2 python snippet_train.py)."""
import torch

import commrt.horovod.torch as hvd          # was: import horovod.torch as hvd

hvd.init()
torch.manual_seed(hvd.rank())               # ranks start from different weights
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=hvd.Compression.fp16)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

torch.manual_seed(100 + hvd.rank())         # each rank its own shard of data
x = torch.randn(64, 8)
y = x.sum(1, keepdim=True)
first = None
for step in range(30):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    first = loss.item() if first is None else first
checksum = sum(p.double().sum().item() for p in model.parameters())
same = hvd.allgather_object(round(checksum, 6))
print(f"rank {hvd.rank()} of {hvd.size()}: loss {first:.4f} -> {loss.item():.4f}; "
      f"weights equal on all ranks: {len(set(same)) == 1}")
hvd.shutdown()
