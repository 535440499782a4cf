"""A fake torchrun: reads torchrun's options and runs the training script once, as the last rank.

The real torchrun starts `nproc_per_node` processes per node; the fake starts one (the
last rank, the one that prints Megatron-LM's iteration lines) with WORLD_SIZE set to the
whole job, in a session of its own as torchrun starts each rank, and reports a failed child
the way torchrun's elastic agent does: an error line, its ChildFailedError summary (the
signal's name when the rank died of one) and exit status 1.

    python -m layoutsearch.testing.fake_torchrun --nproc_per_node 8 --nnodes 1 script.py ...
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import socket
import subprocess
import sys


def _count_launch(script_args: list[str]) -> int:
    """Record this launch in LAYOUTSEARCH_FAKE_LAUNCHES (one line each); its number from 1.

    Counted here, before the heavy imports of the training script, so that a launch killed
    early still counts.
    """
    path = os.environ.get("LAYOUTSEARCH_FAKE_LAUNCHES")
    if not path:
        return 0
    with open(path, "a") as handle:
        handle.write(" ".join(script_args) + "\n")
    with open(path) as handle:
        return sum(1 for _ in handle)


def _report_failure(script: str, pid: int, code: int, *, rank: int, local_rank: int) -> None:
    """What torchrun prints when a rank fails (torch/distributed/elastic, PyTorch 2.x)."""
    now = datetime.datetime.now()
    if code < 0:
        cause = f"Signal {-code} ({signal.Signals(-code).name}) received by PID {pid}"
    else:
        cause = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
    rule = "=" * 60
    print(f"E{now:%m%d %H:%M:%S}.000000 {os.getpid()} torch/distributed/elastic/"
          f"multiprocessing/api.py:874] failed (exitcode: {code}) local_rank: {local_rank} "
          f"(pid: {pid}) of binary: {sys.executable}", flush=True)
    print("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", flush=True)
    print("\n".join([
        rule, f"{script} FAILED", "-" * 60, "Failures:", "  <NO_OTHER_FAILURES>", "-" * 60,
        "Root Cause (first observed failure):", "[0]:",
        f"  time      : {now:%Y-%m-%d_%H:%M:%S}",
        f"  host      : {socket.gethostname()}",
        f"  rank      : {rank} (local_rank: {local_rank})",
        f"  exitcode  : {code} (pid: {pid})",
        "  error_file: <N/A>",
        f"  traceback : {cause}", rule]), flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="torchrun", allow_abbrev=False)
    parser.add_argument("--nproc_per_node", type=int, default=1)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node_rank", type=int, default=0)
    parser.add_argument("--master_addr", default="127.0.0.1")
    parser.add_argument("--master_port", type=int, default=29500)
    parser.add_argument("--rdzv_backend")
    parser.add_argument("--rdzv_id")
    parser.add_argument("--rdzv_endpoint")
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    world = args.nproc_per_node * args.nnodes
    env = {**os.environ, "WORLD_SIZE": str(world), "RANK": str(world - 1),
           "LOCAL_RANK": str(args.nproc_per_node - 1), "MASTER_ADDR": args.master_addr,
           "MASTER_PORT": str(args.master_port),
           "LAYOUTSEARCH_FAKE_LAUNCH_NUMBER": str(_count_launch(args.script_args))}
    if not os.path.isfile(args.script):
        print(f"{sys.executable}: can't open file {args.script!r}: [Errno 2] No such file or "
              "directory", flush=True)
        return 2
    # As torchrun (SubprocessHandler._popen, torch/distributed/elastic/multiprocessing/
    # subprocess_handler): a rank outlives a signal to torchrun's own process group.
    rank = subprocess.Popen([sys.executable, args.script, *args.script_args], env=env,
                            start_new_session=True)
    received: list[int] = []

    def stop(signum: int, frame: object) -> None:
        # As torchrun's elastic agent: pass the signal on to the ranks (the wait below ends
        # when they have stopped), then exit with it.
        received.append(signum)
        rank.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    code = rank.wait()
    if received:
        print(f"torch.distributed.elastic.multiprocessing.api.SignalException: Process "
              f"{os.getpid()} got signal: {received[0]}", flush=True)
        return 128 + received[0]
    if code != 0:
        _report_failure(args.script, rank.pid, code, rank=world - 1,
                        local_rank=args.nproc_per_node - 1)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
