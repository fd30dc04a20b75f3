"""Run a training script unmodified with the helper started, for `vramscope attach`.

    python -m vramscope_live [--address ADDR] [--record FILE] [--step-marker NAME]
                             [--mode auto|agent|poll] [--no-stacks] [--no-holders]
                             [--holders-budget-ms MS] train.py ARGS...
    python -m vramscope_live --version

The script runs as `python train.py ARGS...` would (same `sys.argv`, `__main__`,
`sys.path[0]`), with `vramscope_live.start(...)` called first and `stop()` at exit.
"""

import argparse
import runpy
import sys

import vramscope_live


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m vramscope_live",
        description="Run a PyTorch script with vramscope_live started, so `vramscope attach` can watch it.",
    )
    p.add_argument("--address", default=None, help="unix socket path or HOST:PORT (default: a private unix socket)")
    p.add_argument("--token", default=None, help="the token TCP clients must send (default: a random one, printed)")
    p.add_argument("--record", default=None, metavar="FILE", help="also record to FILE (vramscope attach --replay FILE)")
    p.add_argument("--step-marker", default=None, metavar="NAME", help="a record_function name that marks each step")
    p.add_argument("--mode", default="auto", choices=("auto", "agent", "poll"))
    p.add_argument("--no-stacks", action="store_true", help="no Python stacks (cheaper per event)")
    p.add_argument("--no-holders", action="store_true",
                   help="never walk from the job's Python names to its tensors at step boundaries")
    p.add_argument("--holders-budget-ms", type=float, default=25.0, metavar="MS",
                   help="the most one such walk may take (default 25)")
    p.add_argument("--version", action="store_true", help="print the helper's protocol version and exit")
    p.add_argument("script", nargs="?", help="the Python script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return p


def main(argv=None):
    opts = _parser().parse_args(argv)
    if opts.version:
        print(f"vramscope_live protocol {vramscope_live.PROTOCOL}")
        return 0
    if opts.script is None:
        _parser().print_usage(sys.stderr)
        print("python -m vramscope_live: name the script to run", file=sys.stderr)
        return 2
    vramscope_live.start(
        opts.address,
        token=opts.token,
        stacks=not opts.no_stacks,
        record_to=opts.record,
        step_marker=opts.step_marker,
        mode=opts.mode,
        holders=not opts.no_holders,
        holders_budget_ms=opts.holders_budget_ms,
    )
    sys.argv = [opts.script, *opts.args]
    # An exception (an OOM) goes on to the helper's excepthook, which sends
    # PyTorch's message before the helper stops at exit.
    runpy.run_path(opts.script, run_name="__main__")
    vramscope_live.stop("the script ended")
    return 0


if __name__ == "__main__":
    sys.exit(main())
