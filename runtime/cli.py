"""`tokengate-runtime` command line (placeholder until synth lands)."""
import sys


def main(argv=None) -> int:
    print("tokengate-runtime: commands arrive with the synthetic model factory", file=sys.stderr)
    return 2
