"""all_to_all against OpenMPI and Gloo (python -m commrt.bench collectives --kinds all_to_all)."""
from commrt.bench import collectives


def main(argv):
    return collectives.main(argv, kinds="all_to_all")
