"""The endpoint picker's CPU per decision and added latency over loopback gRPC, beside the
built-in proxy's CPU per request (the logic is ``kvgate.bench.epp``).

    .venv/bin/python benchmarks/epp_bench.py --requests 2000 --concurrency 8

Targets (issue 48): CPU per decision <= 0.15 ms, added p50 <= 0.5 ms.
"""

from __future__ import annotations

import argparse
import json

from kvgate.bench.epp import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--sequential", type=int, default=500, help="requests timed one by one")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    result = run(args.requests, args.concurrency, args.sequential)
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.table())


if __name__ == "__main__":
    main()
