"""``benchmarks/peers.py``: its pure parts, and one small run with kvgate's own routers.

No peer is installed here: the peers' install and launch are exercised by running
the benchmark itself (see docs/benchmarks.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from rich.console import Console

from kvgate.bench import fleet, routers
from kvgate.workload.synthetic import build_workload

from .loading import load_benchmark

peers = load_benchmark("peers")


def run_record(
    router: str, seed: int, hit: float, p99: float, **extra: object
) -> dict[str, object]:
    record: dict[str, object] = {
        "shape": "shape-a",
        "router": router,
        "seed": seed,
        "requests": 100,
        "finished": 100,
        "errors": 0,
        "shed": 0,
        "hit_rate": hit,
        "worker_ttft_p50": p99 / 4,
        "worker_ttft_p99": p99,
        "ttft_floor_p99": p99 / 2,
        "per_worker": [10, 40, 30, 20],
        "bound": 0.5,
        "reference": 0.25,
    }
    record.update(extra)
    return record


def test_summary_gives_mean_and_spread_over_seeds_and_counts_failures_apart() -> None:
    runs = [
        run_record("a", 0, 0.20, 2.0),
        run_record("a", 1, 0.24, 4.0, errors=2, per_worker=[25, 25, 25, 25]),
        run_record("b", 0, 0.10, 8.0),
        {"shape": "shape-a", "router": "b", "seed": 1, "error": "RuntimeError: b exited with 1"},
        {"shape": "shape-a", "router": "c", "seed": 0, "error": "not installed"},
    ]
    summary = peers.summarize(runs)["shape-a"]
    a = summary["a"]
    assert a["runs"] == 2 and a["failed"] == []
    assert a["hit_rate"] == {"mean": pytest.approx(0.22), "min": 0.20, "max": 0.24}
    assert a["worker_ttft_p99"] == {"mean": 3.0, "min": 2.0, "max": 4.0}
    # Per-worker counts are sorted busiest first, then averaged rank by rank.
    assert a["per_worker"] == [32.5, 27.5, 22.5, 17.5]
    assert a["errors"] == 2 and a["requests"] == 200
    assert a["lost_model_share"] == 0.0  # records without the figure count as none lost
    assert summary["b"]["runs"] == 1 and summary["b"]["failed"] == ["RuntimeError: b exited with 1"]
    assert summary["c"] == {"runs": 0, "failed": ["not installed"]}
    assert a["misses"] is None  # no run of a split its misses


def test_misses_are_averaged_per_cause_and_tabled() -> None:
    split = {"new": 10.0, "shared": 2.0, "turn_early": 0.0, "turn_home": 4.0, "turn_moved": 6.0}
    runs = [
        run_record("a", 0, 0.78, 2.0, misses=split),
        run_record("a", 1, 0.80, 2.0, misses={**split, "turn_moved": 4.0, "new": 10.0}),
        run_record("b", 0, 0.5, 2.0),
    ]
    summary = peers.summarize(runs)
    assert summary["shape-a"]["a"]["misses"]["turn_moved"] == 5.0
    table = peers.misses_table(summary)
    assert table is not None
    console = Console(width=200, record=True)
    console.print(table)
    text = console.export_text()
    assert "shape-a" in text and "5.00" in text and "10.00" in text
    assert " b " not in text  # b split none
    assert peers.misses_table(peers.summarize([run_record("b", 0, 0.5, 2.0)])) is None


def test_tables_show_each_router_with_the_bound_and_reference() -> None:
    failed = {"shape": "shape-a", "router": "c", "seed": 0, "error": "pip failed: no such package"}
    summary = peers.summarize(
        [
            run_record("a", 0, 0.20, 2.0),
            run_record("a", 1, 0.24, 4.0),
            run_record("b", 0, 0.1, 0.5),
            failed,
        ]
    )
    console = Console(width=200, record=True)
    console.print(peers.shape_table("shape-a", summary["shape-a"]))
    text = console.export_text()
    assert "infinite-cache bound 50.0%, fleet-KV LRU reference 25.0%" in text
    assert "22.0% (20.0%-24.0%)" in text  # mean and spread of router a
    assert "88%" in text  # a's hit over the reference
    assert "500ms" in text and "3.00s (2.00s-4.00s)" in text
    assert "failed: pip failed" in text
    md = peers.markdown(summary)
    row = "| a | 22.0% (20.0%-24.0%) | 88% | 750ms (500ms-1.00s) | 3.00s (2.00s-4.00s) |"
    assert row + " 1.50s (1.00s-2.00s) |" in md  # the floor p99 beside the p99
    assert "| c | failed: pip failed: no such package |" in md


def test_prefilled_is_the_prompt_tokens_a_worker_did_not_find_cached() -> None:
    """Queried less hit, both counted at every admission (a preempted request's
    recompute included); the prompt counter counts a prompt once and is not used."""
    text = (
        "# TYPE vllm:prompt_tokens counter\n"
        'vllm:prompt_tokens_total{model_name="demo"} 7000.0\n'
        "# TYPE vllm:prefix_cache_queries counter\n"
        'vllm:prefix_cache_queries_total{model_name="demo"} 9000.0\n'
        "# TYPE vllm:prefix_cache_hits counter\n"
        'vllm:prefix_cache_hits_total{model_name="demo"} 6500.0\n'
    )
    assert fleet.prefilled(text) == 2500.0
    assert fleet.prefilled("") == 0.0


def test_targets_put_the_fleets_prefill_beside_the_best_peers() -> None:
    """Warm-ups are prefill no client asked for: the targets say how much the fleet
    computed under kvgate against under the best peer."""
    summary = target_summary(
        run_record("kvgate-default", 0, 0.21, 0.5, fleet_prefill_tokens=90_000),
        run_record("sglang-router", 0, 0.20, 0.6, fleet_prefill_tokens=100_000),
        run_record("smg", 0, 0.19, 0.7, fleet_prefill_tokens=80_000),
    )
    (row,) = peers.targets(summary)
    assert row["prefill_ratio"] == pytest.approx(0.9)  # against sglang-router, best by hit
    assert "0.90x" in peers.targets_markdown([row])
    (unmeasured,) = peers.targets(
        target_summary(run_record("kvgate-default", 0, 0.2, 0.5), run_record("smg", 0, 0.2, 0.5))
    )
    assert unmeasured["prefill_ratio"] is None


def test_requests_served_reads_the_workers_own_counter() -> None:
    text = (
        "# TYPE vllm:request_success counter\n"
        'vllm:request_success_total{finished_reason="stop",model_name="demo"} 3.0\n'
        'vllm:request_success_total{finished_reason="length",model_name="demo"} 4.0\n'
        'vllm:request_success_created{finished_reason="stop",model_name="demo"} 1.7e9\n'
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2.0\n"
    )
    assert fleet.requests_served(text) == 7
    lost = "# TYPE kvgate_workersim_timeline_lost_model_seconds counter\n"
    lost += "kvgate_workersim_timeline_lost_model_seconds_total 2.5\n"
    assert fleet.lost_model_seconds(text + lost) == 2.5
    assert fleet.lost_model_seconds(text) == 0.0


def test_haproxy_config_balances_round_robin_over_every_worker() -> None:
    config = routers.haproxy_config(8080, ["http://127.0.0.1:1", "http://127.0.0.1:2/"])
    assert "bind 127.0.0.1:8080" in config
    assert "balance roundrobin" in config
    assert "server w0 127.0.0.1:1\n" in config and "server w1 127.0.0.1:2\n" in config
    assert "timeout server 900s" in config  # long-context streams must not be cut


def test_peer_command_lines_name_the_policy_workers_and_a_metrics_port(tmp_path: Path) -> None:
    launch = routers.Launch(["http://a", "http://b"], 7000, 7001, tmp_path, 0, tmp_path)
    for name in ("sglang-router", "smg", "vllm-router"):
        argv = routers.ROUTERS[name].argv(launch)
        assert argv[0].startswith(str(tmp_path / "bin"))
        assert argv[argv.index("--policy") + 1] == "cache_aware"
        assert argv[argv.index("--port") + 1] == "7000"
        assert argv[argv.index("--prometheus-port") + 1] == "7001"
        start = argv.index("--worker-urls") + 1
        assert argv[start : start + 2] == ["http://a", "http://b"]
    assert routers.ROUTERS["smg"].argv(launch)[1] == "launch"
    no_venv = routers.Launch(["http://a"], 7000, 7001, tmp_path)
    with pytest.raises(RuntimeError, match="virtualenv"):
        routers.ROUTERS["smg"].argv(no_venv)


def test_cached_virtualenv_is_reused_when_it_holds_the_pinned_version() -> None:
    assert routers._wanted("sglang-router==0.3.2", "0.3.2")
    assert not routers._wanted("sglang-router==0.3.2", "0.3.1")
    assert routers._wanted("smg", "1.13.0")


def test_unknown_names_are_refused() -> None:
    with pytest.raises(SystemExit):
        peers.parse_plan(["--routers", "kvgate-default,nginx"])
    with pytest.raises(SystemExit):
        peers.parse_plan(["--shapes", "nope"])
    plan, _ = peers.parse_plan(["--quick"])
    assert list(plan.seeds) == [0] and plan.quick
    assert [s.name for s in plan.shapes] == [n for n, s in peers.SHAPES.items() if not s.by_name]
    # An extra shape runs only when named.
    plan, _ = peers.parse_plan(["--shapes", "shared-prefix-groups-tight"])
    assert [(s.name, s.kv_blocks) for s in plan.shapes] == [("shared-prefix-groups-tight", 1000)]


@pytest.mark.timeout(600)  # two cold fleets of 4 processes: slow to start on a busy machine
def test_a_small_run_with_kvgate_and_haproxy_measures_every_figure(tmp_path: Path) -> None:
    """kvgate's default and HAProxy (kvgate's round_robin when HAProxy is absent), tiny run."""
    routers = "kvgate-default," + ("haproxy" if shutil.which("haproxy") else "kvgate-round_robin")
    out = tmp_path / "peers.json"
    peers.main(
        [
            "--shapes", "shared-prefix-groups", "--routers", routers, "--seeds", "3",
            "--requests", "24", "--json", str(out), "--logs", str(tmp_path / "logs"),
        ]
    )  # fmt: skip
    import json

    document = json.loads(out.read_text())
    runs = document["runs"]
    assert [r["router"] for r in runs] == routers.split(",")
    for run in runs:
        assert "error" not in run, run
        assert run["finished"] == 24 and run["errors"] == 0
        assert sum(run["per_worker"]) == 24  # the probe is not counted
        assert run["worker_ttft_p99"] >= run["worker_ttft_p50"] > 0
        # Each request's own prefill alone at the cache it got bounds its worker TTFT.
        assert 0 < run["ttft_floor_p99"] <= run["worker_ttft_p99"] + 1e-6
        assert 0 <= run["hit_rate"] <= run["bound"]
        assert run["reference"] == pytest.approx(run["bound"], abs=1e-6)  # the GPU holds it all
        # Every router's misses are split: the emulated workers name themselves.
        split = run["misses"]
        assert 100.0 - sum(split.values()) == pytest.approx(100.0 * run["hit_rate"], abs=0.01)
        # The fleet computed at least what the answers say it did; kvgate's warm-ups more.
        assert run["fleet_prefill_tokens"] >= run["client_prefill_tokens"] > 0
    stateless = runs[1]
    assert stateless["fleet_prefill_tokens"] == stateless["client_prefill_tokens"]
    summary = document["summary"]["shared-prefix-groups"]
    assert set(summary) == set(routers.split(","))
    assert "| kvgate-default |" in document["markdown"]


def tiny_mooncake(folder: Path) -> Path:
    """A Mooncake-format trace: two openings of three 512-token blocks, each asked again."""
    path = folder / "mooncake" / "synthetic_trace.jsonl"
    path.parent.mkdir(parents=True)
    import json

    lines = []
    for i in range(12):
        opening = [(i % 2) * 3 + k for k in range(3)]
        record = {"timestamp": i * 400, "input_length": 1700, "output_length": 8,
                  "hash_ids": [*opening, 100 + i]}  # fmt: skip
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_trace_shape_runs_only_when_named_and_reads_the_traces_folder(tmp_path: Path) -> None:
    assert peers.SHAPES["mooncake-trace"].by_name
    with pytest.raises(SystemExit):  # no trace there
        peers.parse_plan(["--shapes", "mooncake-trace", "--traces", str(tmp_path)])
    path = tiny_mooncake(tmp_path)
    plan, _ = peers.parse_plan(
        ["--shapes", "mooncake-trace", "--traces", str(tmp_path), "--vary", "0.5"]
    )
    (shape,) = plan.shapes
    assert shape.trace == str(path) and shape.workload == "mooncake"  # --vary leaves a trace


@pytest.mark.timeout(300)
def test_a_trace_shape_replays_the_trace_through_kvgate(tmp_path: Path) -> None:
    tiny_mooncake(tmp_path)
    out = tmp_path / "peers.json"
    peers.main(
        [
            "--shapes", "mooncake-trace", "--traces", str(tmp_path),
            "--routers", "kvgate-default", "--seeds", "0", "--requests", "12",
            "--json", str(out), "--logs", str(tmp_path / "logs"),
        ]
    )  # fmt: skip
    import json

    (run,) = json.loads(out.read_text())["runs"]
    assert "error" not in run, run
    assert run["finished"] == 12 and run["errors"] == 0
    # Each opening (1,536 tokens) is asked six times: its five repeats can hit it whole.
    assert run["bound"] == pytest.approx(10 * 1536 / (12 * 1700), abs=0.01)
    assert 0 < run["hit_rate"] <= run["bound"] + 1e-9


def test_vary_jitters_every_shape_by_the_seed() -> None:
    """``--vary`` runs shapes no one tuned on: each seed draws other options."""
    plan, _ = peers.parse_plan(["--vary", "0.5", "--shapes", "shared-prefix-groups,agent-preamble"])
    assert [s.workload for s in plan.shapes] == [
        "shared-prefix-groups:rate=2000,vary=0.5",
        "agent-preamble:vary=0.5",
    ]
    drawn = {repr(build_workload(plan.shapes[1].workload, seed).config) for seed in range(3)}
    assert len(drawn) == 3
    assert repr(build_workload("agent-preamble", 0).config) not in drawn
    with pytest.raises(SystemExit):
        peers.parse_plan(["--vary", "-1"])


def target_summary(*records: dict[str, object]) -> dict[str, object]:
    return peers.summarize(list(records))


@pytest.mark.parametrize(
    ("own", "peer_a", "peer_b", "met"),
    [
        # (hit, p99) of kvgate, sglang-router, smg -> (hit, reference, p99) met
        ((0.200, 0.5), (0.198, 0.6), (0.190, 0.7), (True, True, True)),
        ((0.196, 0.5), (0.200, 0.6), (0.190, 0.4), (True, True, False)),  # a tie; slower
        ((0.190, 0.5), (0.200, 0.6), (0.190, 0.7), (False, True, True)),  # a point below
        ((0.230, 0.5), (0.240, 0.6), (0.245, 0.7), (False, False, True)),  # < 95% of 0.25
        ((0.200, 4.5), (0.190, 6.0), (0.190, 5.0), (True, True, False)),  # 0.9x when overloaded
        ((0.200, 3.9), (0.190, 6.0), (0.190, 5.0), (True, True, True)),  # 0.78x
    ],
)
def test_targets_judge_kvgate_against_the_best_cache_aware_peer(
    own: tuple[float, float],
    peer_a: tuple[float, float],
    peer_b: tuple[float, float],
    met: tuple[bool, bool, bool],
) -> None:
    summary = target_summary(
        run_record("kvgate-default", 0, *own, reference=0.20 if own[0] < 0.23 else 0.25),
        run_record("sglang-router", 0, *peer_a),
        run_record("smg", 0, *peer_b),
    )
    (row,) = peers.targets(summary)
    assert (row["hit_met"], row["reference_met"], row["p99_met"]) == met
    assert row["best_peer_hit"] == max(peer_a[0], peer_b[0])
    assert row["quick_peer_p99"] == min(peer_a[1], peer_b[1])


def test_targets_count_refusals_and_skip_shapes_without_a_peer() -> None:
    summary = target_summary(
        run_record("kvgate-default", 0, 0.2, 0.5, shed=7),
        run_record("smg", 0, 0.2, 0.5),
        {**run_record("kvgate-default", 0, 0.2, 0.5), "shape": "alone"},
        {**run_record("haproxy", 0, 0.1, 0.5), "shape": "alone"},
        {**run_record("kvgate-default", 0, 0.2, 0.5), "shape": "peer-failed"},
        {"shape": "peer-failed", "router": "smg", "seed": 0, "error": "smg exited with 1"},
    )
    (row,) = peers.targets(summary)
    assert row["shape"] == "shape-a" and row["shed"] == 7 and row["peers_shed"] == {"smg": 0}
    console = Console(width=200, record=True)
    console.print(peers.targets_table([row]))
    assert "7/100 (smg 0)" in console.export_text()
    assert "| shape-a | 20.0% / 20.0% (smg) | yes |" in peers.targets_markdown([row])
