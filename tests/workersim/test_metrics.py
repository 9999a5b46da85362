"""``GET /metrics``: vLLM and DCGM exporter names, labels and values."""

from __future__ import annotations

from openai import AsyncOpenAI

from kvgate.workersim import WorkerHandle, WorkerOptions, running_worker

from .conftest import FAST
from .helpers import sample, scrape

VLLM = {"model_name": FAST.model, "engine": "0"}


async def test_vllm_series_follow_the_engine(worker: WorkerHandle, client: AsyncOpenAI) -> None:
    prompt = "A prompt long enough to fill several KV blocks of sixteen tokens each. " * 5
    cached = 0
    for _ in range(3):
        reply = await client.completions.create(model=FAST.model, prompt=prompt, max_tokens=5)
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        cached += reply.usage.prompt_tokens_details.cached_tokens
    families = await scrape(worker.url)
    stats = worker.engine.stats(worker.worker.driver.now())

    assert families["vllm:num_requests_running"].type == "gauge"
    assert sample(families["vllm:num_requests_running"], **VLLM) == stats.running == 0
    assert sample(families["vllm:num_requests_waiting"], **VLLM) == stats.waiting == 0
    usage = sample(families["vllm:kv_cache_usage_perc"], **VLLM)
    assert 0.0 <= usage <= 1.0
    queries = families["vllm:prefix_cache_queries"]
    assert queries.type == "counter"
    assert sample(queries, "_total", **VLLM) == stats.prefix_cache_queries > 0
    hits = sample(families["vllm:prefix_cache_hits"], "_total", **VLLM)
    assert hits == stats.prefix_cache_hits == cached > 0
    assert sample(families["vllm:num_preemptions"], "_total", **VLLM) == stats.preemptions
    success = families["vllm:request_success"]
    assert sample(success, "_total", finished_reason="length", **VLLM) == 3

    ttft = families["vllm:time_to_first_token_seconds"]
    assert ttft.type == "histogram"
    assert sample(ttft, "_count", **VLLM) == 3
    assert sample(ttft, "_bucket", le="+Inf", **VLLM) == 3
    e2e = families["vllm:e2e_request_latency_seconds"]
    assert sample(e2e, "_count", **VLLM) == 3
    assert sample(e2e, "_sum", **VLLM) == stats.e2e.sum

    config = families["vllm:cache_config_info"]
    assert sample(config, block_size=str(FAST.block_size), num_gpu_blocks=str(FAST.kv_blocks)) == 1


async def test_dcgm_series_are_labelled_as_the_exporter_does(worker: WorkerHandle) -> None:
    families = await scrape(worker.url)
    options = worker.options
    labels = {
        "gpu": "0",
        "UUID": worker.worker.gpu_uuid,
        "modelName": options.gpu_name,
        "Hostname": options.hostname,
    }
    stats = worker.engine.stats(worker.worker.driver.now())
    temp = sample(families["DCGM_FI_DEV_GPU_TEMP"], **labels)
    assert temp == stats.gpu_temp_c
    used = sample(families["DCGM_FI_DEV_FB_USED"], **labels)
    free = sample(families["DCGM_FI_DEV_FB_FREE"], **labels)
    assert used == stats.gpu_mem_used_mib
    assert used + free == stats.gpu_mem_total_mib
    assert worker.worker.gpu_uuid.startswith("GPU-")


async def test_two_workers_in_one_process_keep_their_own_metrics(worker: WorkerHandle) -> None:
    other_options = WorkerOptions(port=0, profile="fast", model="other")
    async with (
        running_worker(other_options) as other,
        AsyncOpenAI(base_url=other.url + "/v1", api_key="x", max_retries=0) as oai,
    ):
        await oai.completions.create(model="other", prompt="only here", max_tokens=2)
        mine, theirs = await scrape(worker.url), await scrape(other.url)
    success_mine = mine["vllm:request_success"]
    success_theirs = theirs["vllm:request_success"]
    labels = {"engine": "0", "finished_reason": "length"}
    assert sample(success_mine, "_total", model_name=FAST.model, **labels) == 0
    assert sample(success_theirs, "_total", model_name="other", **labels) == 1


async def test_timeline_jumps_and_the_model_time_they_skipped_are_exported(
    worker: WorkerHandle,
) -> None:
    driver = worker.worker.driver
    # As the driver counts them when its loop falls behind (set here: a test cannot
    # starve its own event loop deterministically).
    driver.lag_jumps, driver.lag_lost_s = 2, 1.5
    families = await scrape(worker.url)
    assert sample(families["kvgate_workersim_timeline_jumps"], "_total") == 2
    assert sample(families["kvgate_workersim_timeline_lost_model_seconds"], "_total") == 1.5
