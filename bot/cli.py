"""`tokengate` command line.

Minimal dispatcher for the evaluation commands (worker/cli.py); the service commands join it
when the bot lands. The worker is imported lazily so `tokengate --help` stays fast.
"""
import argparse
import sys


def main(argv=None) -> int:
    from worker import cli as wcli

    ap = argparse.ArgumentParser(prog="tokengate")
    sub = ap.add_subparsers(dest="cmd", required=True)
    wcli.add_arguments_eval(sub.add_parser("eval", help="evaluate a head revision against its base"))
    wcli.add_arguments_demo(sub.add_parser("demo", help="evaluate a throwaway PR branch of this repository"))
    wcli.add_arguments_calibrate(sub.add_parser("calibrate", help="A/A runs: record each gate's noise"))
    args = ap.parse_args(argv)
    commands = {"eval": wcli.eval_command, "demo": wcli.demo_command, "calibrate": wcli.calibrate_command}
    try:
        return commands[args.cmd](args)
    except ValueError as exc:  # bad input: say it plainly
        print(f"tokengate {args.cmd}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
