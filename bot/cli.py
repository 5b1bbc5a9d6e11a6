"""`tokengate` command line (placeholder until the service and pipeline land)."""
import sys


def main(argv=None) -> int:
    print("tokengate: commands arrive with the evaluation pipeline and service", file=sys.stderr)
    return 2
