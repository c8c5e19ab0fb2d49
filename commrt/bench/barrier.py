"""barrier against OpenMPI and Gloo (python -m commrt.bench collectives --kinds barrier)."""
from commrt.bench import collectives


def main(argv):
    return collectives.main(argv, kinds="barrier")
