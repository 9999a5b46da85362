"""Live benchmarks: the simulator's workloads and traces replayed against a real endpoint.

``run_bench(target, workload, ...)`` turns each simulated request into real
prompt text (``payloads``), sends it at its arrival time with sessions kept in
order (``replay``), streams the answer through one aiohttp session
(``client``), and reports in the simulator's terms (``report``)::

    from kvgate.bench import run_bench
    from kvgate.workload.synthetic import build_workload

    results = await run_bench("http://127.0.0.1:8000", build_workload("chat"), requests=100)
    results["policies"]["live"]["hit_rate"]
"""

from kvgate.bench.runner import DEFAULT_REQUESTS, run_bench, workload_bound

__all__ = ["DEFAULT_REQUESTS", "run_bench", "workload_bound"]
