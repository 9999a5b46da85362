"""The gateway config: defaults that work alone, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.gateway.config import ConfigError, load_config, parse_config, with_overrides
from kvgate.store import MemoryStore, RedisStore, open_store
from kvgate.types import Priority


def test_defaults_need_no_external_service() -> None:
    config = parse_config({})
    assert config.store.url == "memory"
    assert config.listen.host == "127.0.0.1"
    assert config.limits.max_body_bytes == 10 * 1024 * 1024
    assert config.retries.budget_ratio == 0.2 and config.retries.budget_min == 3
    assert config.response_headers is True
    assert config.health.stale_after == 3 * config.health.interval_s
    assert config.admission.max_wait(Priority.SHEDDABLE) == 0


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"listen": {"prot": 1}}, "listen.prot: unknown key"),
        ({"workers": [{"url": "ftp://x"}]}, "workers.0.url"),
        ({"workers": [{"url": "http://a", "max_in_flight": 0}]}, "workers.0.max_in_flight"),
        ({"store": {"url": "mongodb://x"}}, "store.url"),
        ({"timeouts": {"connect_s": -1}}, "timeouts.connect_s"),
        ({"features": {"block_chars": 0}}, "features.block_chars"),
        ({"surprise": True}, "surprise: unknown key"),
    ],
)
def test_bad_config_is_refused_naming_the_key(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        parse_config(data)


def test_duplicate_workers_are_refused() -> None:
    with pytest.raises(ConfigError, match="listed twice"):
        parse_config({"workers": [{"url": "http://a:1"}, {"url": "http://a:1/"}]})


def test_yaml_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "kvgate.yaml"
    path.write_text(
        "listen: {port: 9000}\n"
        "policy: {name: round_robin}\n"
        "workers:\n"
        "  - {url: 'http://w1:8000', model: llama, version: v2, labels: {zone: a}}\n"
        "  - {url: 'http://w2:8000', dcgm_url: 'http://w2:9400/metrics'}\n"
    )
    config = load_config(path)
    assert config.listen.port == 9000
    assert config.workers[0].model == "llama" and config.workers[0].version == "v2"
    assert config.workers[1].scrape_url == "http://w2:8000/metrics"
    assert config.workers[1].dcgm_url == "http://w2:9400/metrics"


def test_unreadable_and_non_mapping_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(path)


def test_command_line_overrides_apply_on_top() -> None:
    base = parse_config({"policy": {"name": "default", "options": {}}, "listen": {"port": 1}})
    config = with_overrides(
        base, workers=["http://a:1", "http://b:2"], port=8080, store="redis://r:6379/0"
    )
    assert [w.url for w in config.workers] == ["http://a:1", "http://b:2"]
    assert config.listen.port == 8080
    assert config.store.url == "redis://r:6379/0"


def test_processes_default_to_one_on_the_memory_store_and_one_per_core_on_redis(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1, 2})
    assert parse_config({}).server_processes() == 1
    assert parse_config({"store": {"url": "redis://h:6379/0"}}).server_processes() == 3
    assert parse_config({"listen": {"processes": 1}}).server_processes() == 1
    explicit = {"listen": {"processes": 2}, "store": {"url": "redis://h:6379/0"}}
    assert parse_config(explicit).server_processes() == 2


def test_several_processes_on_the_memory_store_are_refused() -> None:
    with pytest.raises(ConfigError, match="cannot share the memory store"):
        parse_config({"listen": {"processes": 2}})
    with pytest.raises(ConfigError, match="cannot share the memory store"):
        with_overrides(parse_config({}), processes=4)
    both = with_overrides(parse_config({}), processes=4, store="redis://h:6379/0")
    assert both.server_processes() == 4


async def test_store_timeouts_reach_a_redis_store_only() -> None:
    data = {"url": "redis://h:6379/0", "timeout_s": 1.5, "connect_timeout_s": 3.0}
    config = parse_config({"store": data}).store
    options = config.backend_options()
    assert options == {
        "socket_timeout": 1.5,
        "connect_timeout": 3.0,
        "max_per_scope": 100_000,
        "max_holders_per_scope": 500_000,
    }
    store = open_store(config.effective_url, **options)  # the memory store would refuse them
    assert isinstance(store, RedisStore)
    await store.close()
    memory = parse_config({"store": {"timeout_s": 1.5}}).store
    assert isinstance(open_store(memory.effective_url, **memory.backend_options()), MemoryStore)
