"""Drive a running-from-scratch inferd with Triton's perf_analyzer and print a results table.

    python benchmarks/run.py --repository examples-repo --model simple --concurrency 1 16

Starts ``inferd serve`` on a free loopback port, runs perf_analyzer (gRPC, the Triton protocol)
at each concurrency, stops the server, and prints a Markdown table with the exact commands.
perf_analyzer ships in the ``tritonclient==2.41.0`` wheel; it needs Debian's ``libb64-0d`` and
``libcudart.so.12`` (pip ``nvidia-cuda-runtime-cu12``) although it runs without a GPU.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cudart_dir(python: str) -> str:
    """Folder with libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel (installed if absent)."""
    probe = (
        "import nvidia.cuda_runtime, os; "
        "print(os.path.join(nvidia.cuda_runtime.__path__[0], 'lib'))"
    )
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if found.returncode != 0:
        subprocess.run(
            [python, "-m", "pip", "install", "-q", "nvidia-cuda-runtime-cu12"], check=True
        )
        found = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True)
    return found.stdout.strip()


def start_server(
    python: str, repository: Path, extra: list[str]
) -> tuple[subprocess.Popen[str], int]:
    cmd = [
        python,
        "-m",
        "inferd",
        "serve",
        "--model-repository",
        str(repository),
        "--grpc-port",
        "0",
        "--host",
        "127.0.0.1",
        "--log-format",
        "json",
        *extra,
    ]
    server = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    assert server.stderr is not None
    deadline = time.monotonic() + 120
    for line in server.stderr:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("event") == "server started":
            return server, int(event["port"])
        if time.monotonic() > deadline:
            break
    server.kill()
    raise RuntimeError("inferd did not start")


def perf_analyzer(
    binary: str, env: dict[str, str], model: str, port: int, concurrency: int, interval_ms: int
) -> tuple[dict[str, str], str]:
    with tempfile.NamedTemporaryFile(suffix=".csv") as out:
        cmd = [
            binary,
            "-m",
            model,
            "-i",
            "grpc",
            "-u",
            f"127.0.0.1:{port}",
            "--concurrency-range",
            f"{concurrency}:{concurrency}",
            "--measurement-interval",
            str(interval_ms),
            "--percentile",
            "99",
            "-f",
            out.name,
        ]
        subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
        with open(out.name) as f:
            rows = list(csv.DictReader(f))
    return rows[0], shlex.join(cmd)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--repository", type=Path, default=Path("examples-repo"))
    parser.add_argument("--model", default="simple")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--measurement-interval", type=int, default=5000, help="ms per window")
    parser.add_argument("--server-arg", action="append", default=[], help="extra inferd serve flag")
    args = parser.parse_args()

    binary = shutil.which("perf_analyzer", path=str(Path(args.python).parent))
    if binary is None:
        print("perf_analyzer not found next to the Python (pip install tritonclient==2.41.0)")
        return 1
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = cudart_dir(args.python) + ":" + env.get("LD_LIBRARY_PATH", "")
    server, port = start_server(args.python, args.repository, args.server_arg)
    try:
        results = [
            (c, *perf_analyzer(binary, env, args.model, port, c, args.measurement_interval))
            for c in args.concurrency
        ]
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}; "
        f"python {platform.python_version()}"
    )
    print(
        f"server: inferd serve --model-repository {args.repository} {' '.join(args.server_arg)}\n"
    )
    print(
        "| model | concurrency | infer/s | p50 µs | p99 µs | server queue µs | server compute µs |"
    )
    print("|---|---|---|---|---|---|---|")
    for concurrency, row, _ in results:
        print(
            f"| {args.model} | {concurrency} | {float(row['Inferences/Second']):.0f} | "
            f"{row['p50 latency']} | {row['p99 latency']} | {row['Server Queue']} | "
            f"{row['Server Compute Infer']} |"
        )
    print("\ncommands:")
    for _, _, cmd in results:
        print(f"    {cmd.replace(str(port), 'PORT')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
