import pytest

from kvgate.engine import EngineConfig
from kvgate.engine.profiles import MIB, PROFILES


def test_num_gpu_blocks_is_derived_from_the_profile() -> None:
    cfg = EngineConfig(profile="h100-llama3-8b")
    p = PROFILES["h100-llama3-8b"]
    kv_bytes = (p.gpu_total_mib * cfg.gpu_memory_utilization - p.weights_mib) * MIB
    assert cfg.kv_bytes_per_block == p.kv_bytes_per_token * cfg.block_size
    assert cfg.num_gpu_blocks == int(kv_bytes // cfg.kv_bytes_per_block)
    assert cfg.kv_capacity_tokens == cfg.num_gpu_blocks * cfg.block_size


def test_explicit_values_win() -> None:
    cfg = EngineConfig(profile="fast", num_gpu_blocks=12, gpu_total_mib=100.0, idle_temp_c=20.0)
    assert (cfg.num_gpu_blocks, cfg.gpu_total_mib, cfg.idle_temp_c) == (12, 100.0, 20.0)
    assert cfg.max_temp_c == PROFILES["fast"].max_temp_c


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": 0},
        {"max_num_seqs": 0},
        {"max_batched_tokens": 0},
        {"num_gpu_blocks": -1},
        {"cpu_offload_blocks": -1},
        {"cpu_bandwidth_gb_s": 0.0},
        {"gpu_memory_utilization": 1.5},
        {"profile": "nope"},
        {"weights_mib": 10**9},
    ],
)
def test_invalid_configs_fail_at_construction(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        EngineConfig(**kwargs)  # type: ignore[arg-type]
