"""Secrets come from the environment (``${NAME}``) or from files (``X_file``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.gateway.config import ConfigError, load_config, parse_config


def test_every_secret_from_the_environment() -> None:
    env = {"TOKEN": "t0k", "KEY": "ck", "VLLM": "wk", "PW": "p@ss:/w"}
    config = parse_config(
        {
            "admin_token": "${TOKEN}",
            "api_keys": ["${KEY}", "literal"],
            "workers": [{"url": "http://w:1", "api_key": "${VLLM}"}],
            "store": {"url": "redis://redis:6379/0", "password": "${PW}"},
        },
        env,
    )
    assert config.admin_token == "t0k"
    assert config.api_keys == ["ck", "literal"]
    assert config.workers[0].api_key == "wk"
    assert config.store.effective_url == "redis://:p%40ss%3A%2Fw@redis:6379/0"


def test_secrets_from_files(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-file\n")
    (tmp_path / "keys").write_text("k1\n\nk2\n")
    (tmp_path / "pw").write_text("pw\n")
    path = tmp_path / "kvgate.yaml"
    path.write_text(
        f"admin_token_file: {tmp_path / 'token'}\n"
        f"api_keys_file: {tmp_path / 'keys'}\n"
        f"store: {{url: 'redis://r:6379/0', password_file: {tmp_path / 'pw'}}}\n"
        f"workers: [{{url: 'http://w:1', api_key_file: {tmp_path / 'token'}}}]\n"
    )
    config = load_config(path)
    assert config.admin_token == "from-file"
    assert config.api_keys == ["k1", "k2"]
    assert config.workers[0].api_key == "from-file"
    assert config.store.effective_url == "redis://:pw@r:6379/0"


def test_defaults_literals_and_errors_name_the_key(tmp_path: Path) -> None:
    config = parse_config({"workers": [{"url": "http://${HOST:-w}:1"}], "admin_token": "$${X}"}, {})
    assert config.workers[0].url == "http://w:1"
    assert config.admin_token == "${X}"
    with pytest.raises(ConfigError, match=r"workers\.0\.api_key: environment variable NOPE"):
        parse_config({"workers": [{"url": "http://w:1", "api_key": "${NOPE}"}]}, {})
    with pytest.raises(ConfigError, match="admin_token_file: cannot read"):
        parse_config({"admin_token_file": str(tmp_path / "missing")}, {})
    with pytest.raises(ConfigError, match="give admin_token or admin_token_file, not both"):
        parse_config({"admin_token": "a", "admin_token_file": str(tmp_path)}, {})


def test_secrets_are_not_in_the_config_repr() -> None:
    config = parse_config({"admin_token": "s3cret", "api_keys": ["k3y"]}, {})
    assert "s3cret" not in repr(config) and "k3y" not in repr(config)


def test_a_workers_key_is_not_in_the_config_repr() -> None:
    """A worker trusts whoever holds its key: the gateway's config (and a worker's, as
    discovery and ``POST /admin/workers`` make them) never renders it."""
    config = parse_config(
        {"workers": [{"url": "http://w:1", "api_key": "w0rker-k3y"}], "store": {"password": "pw"}}
    )
    assert config.workers[0].api_key == "w0rker-k3y"
    assert "w0rker-k3y" not in repr(config) and "w0rker-k3y" not in repr(config.workers[0])
    assert "w0rker-k3y" not in str(config.workers[0])


def test_aliases_must_name_models() -> None:
    with pytest.raises(ConfigError, match="an alias must name a model"):
        parse_config({"model_aliases": {"a": "b", "b": "c"}})
