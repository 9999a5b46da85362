"""The prediction-error benchmark's reading of a gateway's /metrics, and its per-shape summary."""

from __future__ import annotations

from kvgate.bench.prediction import per_worker, summary

PAGE = """\
# HELP kvgate_worker_ttft_prediction_error_ratio Median error.
# TYPE kvgate_worker_ttft_prediction_error_ratio gauge
kvgate_worker_ttft_prediction_error_ratio{worker="a"} 0.2
kvgate_worker_ttft_prediction_error_ratio{worker="b"} 0.4
# HELP kvgate_worker_learned_prefill_seconds_per_token Prefill.
# TYPE kvgate_worker_learned_prefill_seconds_per_token gauge
kvgate_worker_learned_prefill_seconds_per_token{worker="a"} 8e-05
# HELP kvgate_worker_speed_observations Observations.
# TYPE kvgate_worker_speed_observations gauge
kvgate_worker_speed_observations{worker="a"} 12
# HELP kvgate_requests_total Other.
# TYPE kvgate_requests_total counter
kvgate_requests_total{worker="a"} 3
"""


def test_per_worker_reads_the_error_and_the_learned_speed() -> None:
    got = per_worker(PAGE)
    assert got == {
        "a": {"error": 0.2, "prefill_s": 8e-05, "observations": 12.0},
        "b": {"error": 0.4},
    }


def test_summary_is_the_median_of_the_runs_per_shape() -> None:
    def run(shape: str, median: float, worst: float, load: float) -> dict[str, object]:
        return {
            "scenario": shape,
            "median_error": median,
            "max_worker_error": worst,
            "client_over_model": 1.1,
            "load_average": (load, load),
        }

    runs = [run("x", 0.1, 0.3, 2.0), run("x", 0.3, 0.5, 4.0), run("x", 0.2, 0.2, 1.0)]
    runs.append({"scenario": "y", "median_error": None})  # a run with no figure
    assert summary(runs) == {
        "x": {
            "runs": 3,
            "median_error": 0.2,
            "max_worker_error": 0.5,
            "client_over_model": 1.1,
            "load": 4.0,
        }
    }
