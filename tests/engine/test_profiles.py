import pytest

from kvgate.engine.profiles import PROFILES, get_profile


def test_required_profiles_exist() -> None:
    assert {"h100-llama3-8b", "a100-llama3-8b", "cpu-small", "fast"} <= set(PROFILES)


def test_step_time_follows_the_formula() -> None:
    p = PROFILES["h100-llama3-8b"]
    expected = (
        p.step_base_s
        + 1000 / p.prefill_tokens_per_s
        + 8 * p.decode_per_seq_s
        + 4000 * p.attention_per_ctx_token_s
    )
    assert p.step_time(1000, 8, 4000) == pytest.approx(expected)


def test_llama3_8b_kv_size_is_128_kib_a_token() -> None:
    assert PROFILES["h100-llama3-8b"].kv_bytes_per_token == 128 * 1024


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profiles_are_sane(name: str) -> None:
    p = PROFILES[name]
    assert p.name == name
    assert p.weights_mib < p.gpu_total_mib
    assert p.idle_temp_c < p.max_temp_c
    # One token of prefill costs more than moving its KV over PCIe (25 GB/s).
    assert 1 / p.prefill_tokens_per_s > p.kv_bytes_per_token / 25e9


def test_h100_is_faster_than_a100() -> None:
    h, a = PROFILES["h100-llama3-8b"], PROFILES["a100-llama3-8b"]
    assert h.step_time(2048, 32, 65536) < a.step_time(2048, 32, 65536)


def test_unknown_profile_is_an_error() -> None:
    with pytest.raises(ValueError, match="h100-llama3-8b"):
        get_profile("tpu-v9")


def test_a_scaled_profile_takes_one_over_speed_as_long_for_every_step() -> None:
    h100 = get_profile("h100-llama3-8b")
    half = h100.scaled(0.5)
    for step in ((2048, 0, 0), (0, 32, 40_000), (512, 8, 9_000)):
        assert half.step_time(*step) == pytest.approx(2 * h100.step_time(*step))
    assert half.gpu_total_mib == h100.gpu_total_mib  # memory is the device's, unchanged
    assert h100.scaled(1.0) is h100
    with pytest.raises(ValueError):
        h100.scaled(0.0)
