"""reduce-scatter bandwidth and latency per algorithm, with OpenMPI and Gloo (see allreduce)."""
from commrt.bench import allreduce


def main(argv):
    return allreduce.main(argv, kind="reduce_scatter")
