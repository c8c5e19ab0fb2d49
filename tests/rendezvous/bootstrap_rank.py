"""One rank of a bootstrap test: find the world from the environment, open the
store, meet every other rank through it, print what it learned as JSON."""
import json
import os
import sys

from commrt.rendezvous.bootstrap import from_environment, open_store

info = from_environment()
store, server = open_store(info, timeout=20.0)
store.set(f"test/host/{info.rank}", info.host_id.encode())
peers = [store.get(f"test/host/{r}").decode() for r in range(info.size)]
store.set(f"test/done/{info.rank}", b"")
if server is not None:  # the host of the store stays until everyone is done with it
    store.wait([f"test/done/{r}" for r in range(info.size)])
result = json.dumps({"rank": info.rank, "size": info.size, "local_rank": info.local_rank,
                     "local_size": info.local_size, "launcher": info.launcher,
                     "hosted": server is not None, "peers": peers, "data_addr": info.data_addr,
                     "file": info.rendezvous_file})
out_dir = os.environ.get("TEST_OUT_DIR")
if out_dir:  # mpirun may merge the lines of different ranks: one file each instead
    with open(os.path.join(out_dir, f"{info.rank}.json"), "w") as f:
        f.write(result)
else:
    print(result, flush=True)
store.close()
if server is not None:
    server.close()
sys.exit(0)
