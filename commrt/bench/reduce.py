"""reduce against OpenMPI and Gloo (python -m commrt.bench collectives --kinds reduce)."""
from commrt.bench import collectives


def main(argv):
    return collectives.main(argv, kinds="reduce")
