"""Tables of realistic ``/metrics`` bodies mapped to ``WorkerSignals``."""

from __future__ import annotations

import pytest

from kvgate.gateway.observe.scrape import ScrapeError, WorkerSignals, merge, parse_worker_metrics

# vLLM v1 (0.9+): counters carry ``_total`` in the text; two data-parallel engines.
VLLM_V1 = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.62
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.41
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
vllm:num_preemptions_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 6000.0
vllm:prefix_cache_queries_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3000.0
vllm:prefix_cache_hits_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1000.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 9.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 9.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.5
"""

# vLLM v0 (before 0.9): the older KV gauge name, one model_name label set.
VLLM_V0 = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama-2-7b"} 1.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="llama-2-7b"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llama-2-7b"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="llama-2-7b"} 0.25
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="llama-2-7b"} 0.0
"""

# Bare counter names, as a hand-written exporter might emit them (no ``_total``).
VLLM_BARE = """\
vllm:num_requests_running 2
vllm:num_requests_waiting 1
vllm:kv_cache_usage_perc 0.5
vllm:num_preemptions 3
vllm:prefix_cache_queries 200
vllm:prefix_cache_hits 150
"""

SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.0
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:cache_hit_rate The cache hit rate
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.75
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
"""

LLAMACPP_OLD = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 3469
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.125
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
"""

# Newer llama.cpp dropped the KV gauge; a build that counts cached tokens.
LLAMACPP_CACHED = """\
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 300
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 100
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 0
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
"""

# The exporter's usual labels on one H100.
H100_LABELS = (
    'gpu="0",UUID="GPU-aa",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"'
)

DCGM_ONE = """\
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{@L} 64
# HELP DCGM_FI_DEV_MEMORY_TEMP Memory temperature (in C).
# TYPE DCGM_FI_DEV_MEMORY_TEMP gauge
DCGM_FI_DEV_MEMORY_TEMP{@L} 71
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{@L} 87
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{@L} 8000
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{@L} 72000
""".replace("@L", H100_LABELS)

# Four GPUs of one tensor-parallel group: GPU 2 is the hottest, GPU 1 the fullest,
# GPU 3 reports blanks for everything.
DCGM_MULTI = """\
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a"} 60
DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-b"} 70
DCGM_FI_DEV_GPU_TEMP{gpu="2",UUID="GPU-c"} 85
DCGM_FI_DEV_GPU_TEMP{gpu="3",UUID="GPU-d"} 2147483632
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a"} 40000
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-b"} 76000
DCGM_FI_DEV_FB_USED{gpu="2",UUID="GPU-c"} 50000
DCGM_FI_DEV_FB_USED{gpu="3",UUID="GPU-d"} 9223372036854775794
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-a"} 40000
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-b"} 4000
DCGM_FI_DEV_FB_FREE{gpu="2",UUID="GPU-c"} 30000
DCGM_FI_DEV_FB_FREE{gpu="3",UUID="GPU-d"} 9223372036854775794
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            VLLM_V1,
            WorkerSignals(
                engine="vllm",
                running=5,
                waiting=4,
                kv_usage=0.62,
                preemptions_total=8,
                prefix_cache_queries_total=10000,
                prefix_cache_hits_total=4000,
                prefix_cache_hit_rate=0.4,
            ),
            id="vllm-v1-two-engines",
        ),
        pytest.param(
            VLLM_V0,
            WorkerSignals(engine="vllm", running=1, waiting=0, kv_usage=0.25, preemptions_total=0),
            id="vllm-v0-gpu-cache-usage",
        ),
        pytest.param(
            VLLM_BARE,
            WorkerSignals(
                engine="vllm",
                running=2,
                waiting=1,
                kv_usage=0.5,
                preemptions_total=3,
                prefix_cache_queries_total=200,
                prefix_cache_hits_total=150,
                prefix_cache_hit_rate=0.75,
            ),
            id="vllm-bare-counter-names",
        ),
        pytest.param(
            SGLANG,
            WorkerSignals(
                engine="sglang", running=12, waiting=5, kv_usage=0.28, prefix_cache_hit_rate=0.75
            ),
            id="sglang",
        ),
        pytest.param(
            LLAMACPP_OLD,
            WorkerSignals(
                engine="llamacpp", running=1, waiting=2, kv_usage=0.125, generated_total=3469
            ),
            id="llamacpp-with-kv-ratio-no-cached-counter",
        ),
        pytest.param(
            LLAMACPP_CACHED,
            WorkerSignals(
                engine="llamacpp",
                running=0,
                waiting=0,
                prefix_cache_queries_total=400,
                prefix_cache_hits_total=100,
                prefix_cache_hit_rate=0.25,
            ),
            id="llamacpp-cached-counter",
        ),
        pytest.param(
            DCGM_ONE,
            WorkerSignals(
                gpu_count=1,
                gpu_temp_c=64.0,
                gpu_mem_temp_c=71.0,
                gpu_util=0.87,
                gpu_mem_used_mib=72000.0,
                gpu_mem_total_mib=80000.0,
                gpu_mem_usage=0.9,
            ),
            id="dcgm-one-gpu",
        ),
        pytest.param(
            DCGM_MULTI,
            WorkerSignals(
                gpu_count=4,
                gpu_temp_c=85.0,
                gpu_mem_used_mib=76000.0,
                gpu_mem_total_mib=80000.0,
                gpu_mem_usage=0.95,
            ),
            id="dcgm-multi-gpu-worst-wins-blanks-ignored",
        ),
        pytest.param(
            VLLM_V0 + DCGM_ONE,
            WorkerSignals(
                engine="vllm",
                running=1,
                waiting=0,
                kv_usage=0.25,
                preemptions_total=0,
                gpu_count=1,
                gpu_temp_c=64.0,
                gpu_mem_temp_c=71.0,
                gpu_util=0.87,
                gpu_mem_used_mib=72000.0,
                gpu_mem_total_mib=80000.0,
                gpu_mem_usage=0.9,
            ),
            id="engine-and-dcgm-in-one-body",
        ),
        pytest.param("", WorkerSignals(), id="empty-body-all-unknown"),
        pytest.param(
            "process_cpu_seconds_total 12.5\n", WorkerSignals(), id="unrelated-metrics-unknown"
        ),
    ],
)
def test_parse_maps_engine_names(text: str, expected: WorkerSignals) -> None:
    assert_signals(parse_worker_metrics(text), expected)


def assert_signals(got: WorkerSignals, expected: WorkerSignals) -> None:
    """Field-by-field equality with float tolerance, naming the field that differs."""
    for name in WorkerSignals.__dataclass_fields__:
        g, e = getattr(got, name), getattr(expected, name)
        if isinstance(e, float):
            assert g == pytest.approx(e), name
        else:
            assert g == e, name


@pytest.mark.parametrize(
    ("text", "field"),
    [
        pytest.param(
            'vllm:num_requests_running 1\nvllm:kv_cache_usage_perc{model_name="m"} NaN\n',
            "kv_usage",
            id="nan-kv-usage",
        ),
        pytest.param(
            "vllm:num_requests_running 1\nvllm:kv_cache_usage_perc +Inf\n",
            "kv_usage",
            id="inf-kv-usage",
        ),
        pytest.param(
            "vllm:num_requests_running 1\nvllm:num_requests_waiting -1\n",
            "waiting",
            id="negative-count",
        ),
        pytest.param("sglang:num_running_reqs 1\n", "kv_usage", id="absent-metric"),
        pytest.param('DCGM_FI_DEV_GPU_TEMP{gpu="0"} 2147483647\n', "gpu_temp_c", id="int32-max"),
        pytest.param(
            'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 2147483632\n', "gpu_temp_c", id="dcgm-int32-blank"
        ),
        pytest.param('DCGM_FI_DEV_GPU_TEMP{gpu="0"} 4294967295\n', "gpu_temp_c", id="uint32-max"),
        pytest.param(
            'DCGM_FI_DEV_FB_USED{gpu="0"} 9223372036854775794\nDCGM_FI_DEV_FB_FREE{gpu="0"} 10\n',
            "gpu_mem_used_mib",
            id="dcgm-int64-blank",
        ),
        pytest.param(
            'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 140737488355328\n', "gpu_temp_c", id="dcgm-fp64-blank"
        ),
        pytest.param('DCGM_FI_DEV_GPU_TEMP{gpu="0"} NaN\n', "gpu_temp_c", id="dcgm-nan"),
        pytest.param('DCGM_FI_DEV_FB_USED{gpu="0"} 70000\n', "gpu_mem_usage", id="fb-free-missing"),
    ],
)
def test_unknown_values_are_none_not_zero(text: str, field: str) -> None:
    assert getattr(parse_worker_metrics(text), field) is None


def test_nan_keeps_engine_recognised() -> None:
    signals = parse_worker_metrics("vllm:kv_cache_usage_perc NaN\n")
    assert (signals.engine, signals.kv_usage) == ("vllm", None)


def test_newer_kv_name_wins_over_older() -> None:
    text = "vllm:kv_cache_usage_perc 0.3\nvllm:gpu_cache_usage_perc 0.9\n"
    assert parse_worker_metrics(text).kv_usage == pytest.approx(0.3)


def test_fractions_are_clamped_to_one() -> None:
    assert parse_worker_metrics("sglang:token_usage 1.02\n").kv_usage == 1.0


def test_duplicate_gpu_label_sets_keep_real_reading() -> None:
    text = (
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",pod=""} 2147483647\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",pod="vllm-0"} 77\n'
    )
    signals = parse_worker_metrics(text)
    assert (signals.gpu_count, signals.gpu_temp_c) == (1, 77.0)


def test_now_is_stamped() -> None:
    assert parse_worker_metrics(VLLM_V0, now=12.5).scraped_at == 12.5


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("<html><body>404 Not Found</body></html>", id="html"),
        pytest.param('{"status": "ok"}', id="json"),
        pytest.param("hello world", id="words"),
        pytest.param('vllm:num_requests_running{model_name="m" 1\n', id="unclosed-labels"),
    ],
)
def test_garbage_raises_scrape_error(text: str) -> None:
    with pytest.raises(ScrapeError, match="not Prometheus text format"):
        parse_worker_metrics(text)


@pytest.mark.parametrize(
    ("engine", "dcgm", "expected"),
    [
        pytest.param(
            WorkerSignals(engine="vllm", running=2, kv_usage=0.5, scraped_at=10.0),
            WorkerSignals(gpu_count=1, gpu_temp_c=70.0, gpu_mem_usage=0.9, scraped_at=8.0),
            WorkerSignals(
                engine="vllm",
                running=2,
                kv_usage=0.5,
                gpu_count=1,
                gpu_temp_c=70.0,
                gpu_mem_usage=0.9,
                scraped_at=8.0,
            ),
            id="disjoint-fields-older-stamp",
        ),
        pytest.param(
            WorkerSignals(engine="vllm", gpu_count=1, gpu_temp_c=50.0, gpu_mem_usage=0.2),
            WorkerSignals(gpu_count=2, gpu_temp_c=80.0),
            WorkerSignals(engine="vllm", gpu_count=2, gpu_temp_c=80.0, gpu_mem_usage=0.2),
            id="dcgm-wins-gpu-engine-fills-gaps",
        ),
        pytest.param(
            WorkerSignals(),
            WorkerSignals(engine="sglang", waiting=3),
            WorkerSignals(engine="sglang", waiting=3),
            id="engine-unknown-falls-back",
        ),
    ],
)
def test_merge(engine: WorkerSignals, dcgm: WorkerSignals, expected: WorkerSignals) -> None:
    assert merge(engine, dcgm) == expected


@pytest.mark.parametrize(
    ("signals", "expected"),
    [
        pytest.param(WorkerSignals(kv_usage=0.5, gpu_mem_usage=0.9), 0.9, id="gpu-higher"),
        pytest.param(WorkerSignals(kv_usage=0.95, gpu_mem_usage=0.9), 0.95, id="kv-higher"),
        pytest.param(WorkerSignals(kv_usage=0.4), 0.4, id="kv-only"),
        pytest.param(WorkerSignals(), None, id="unknown"),
    ],
)
def test_memory_usage_is_the_higher_signal(signals: WorkerSignals, expected: float | None) -> None:
    assert signals.memory_usage == expected


def test_llamacpp_prefill_rate_is_its_seconds_over_the_tokens_it_evaluated() -> None:
    text = LLAMACPP_CACHED + "# TYPE llamacpp:prompt_seconds_total counter\n"
    text += "llamacpp:prompt_seconds_total 5.0\n"
    signals = parse_worker_metrics(text)
    # 300 tokens evaluated (the cached 100 were not) in 5 s: 60 tokens/s.
    assert signals.prefill_s_per_token == pytest.approx(5.0 / 300)
    assert parse_worker_metrics(LLAMACPP_CACHED).prefill_s_per_token is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "# TYPE vllm:generation_tokens_total counter\n"
            'vllm:generation_tokens_total{engine="0",model_name="m"} 1200.0\n'
            'vllm:generation_tokens_total{engine="1",model_name="m"} 34.0\n',
            1234,
            id="vllm-v1-two-engines",
        ),
        pytest.param('vllm:generation_tokens{model_name="m"} 7.0\n', 7, id="vllm-bare"),
        pytest.param('sglang:generation_tokens_total{model_name="m"} 99.0\n', 99, id="sglang"),
        pytest.param("llamacpp:tokens_predicted_total 42\n", 42, id="llamacpp"),
        pytest.param(VLLM_V0, None, id="none-published"),
    ],
)
def test_tokens_generated_so_far_are_read_from_each_engine(text: str, expected: int | None) -> None:
    """An engine generating tokens is alive (``gateway.dataplane.attempt``'s second opinion
    on a timed-out non-streamed answer): its own counter, summed over its engines."""
    assert parse_worker_metrics(text).generated_total == expected
