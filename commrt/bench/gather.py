"""gather against OpenMPI and Gloo (python -m commrt.bench collectives --kinds gather)."""
from commrt.bench import collectives


def main(argv):
    return collectives.main(argv, kinds="gather")
