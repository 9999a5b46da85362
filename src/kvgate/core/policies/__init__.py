"""Every routing policy, registered explicitly in one place.

Config picks a policy by name (``policy: prefix_affinity``); ``default`` is used
when none is named. An unknown name raises ``UnknownPolicyError`` at start-up.
Each call of ``default_registry`` returns a fresh registry, and each ``build``
a fresh policy with its own state, so side-by-side runs never share an index.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kvgate.core.policies.cache_aware import CacheAware, CacheAwareConfig
from kvgate.core.policies.consistent_hash import ConsistentHash, ConsistentHashConfig
from kvgate.core.policies.default import DefaultConfig, DefaultPolicy
from kvgate.core.policies.least_request import LeastRequest, LeastRequestConfig
from kvgate.core.policies.power_of_two import PowerOfTwo, PowerOfTwoConfig
from kvgate.core.policies.prefix_affinity import PrefixAffinity, PrefixAffinityConfig
from kvgate.core.policies.random_choice import RandomChoice, RandomConfig
from kvgate.core.policies.round_robin import RoundRobin, RoundRobinConfig
from kvgate.core.policies.session_affinity import SessionAffinity, SessionAffinityConfig
from kvgate.core.policies.ttft import TtftConfig, TtftPolicy
from kvgate.core.prefix import FeatureConfig
from kvgate.core.registry import PolicyRegistry, PolicySpec, UnknownPolicyError

DEFAULT_POLICY = "default"
"""The policy used when the config names none."""


def default_registry() -> PolicyRegistry:
    """A registry holding every built-in policy."""
    return PolicyRegistry(
        [
            PolicySpec(
                "default",
                DefaultConfig,
                DefaultPolicy,
                "sessions stick; new work goes to its cached prefix, else bounded hash",
            ),
            PolicySpec("round_robin", RoundRobinConfig, RoundRobin, "each candidate in turn"),
            PolicySpec("random", RandomConfig, RandomChoice, "uniform random candidate"),
            PolicySpec("least_request", LeastRequestConfig, LeastRequest, "least loaded"),
            PolicySpec("power_of_two", PowerOfTwoConfig, PowerOfTwo, "less loaded of two random"),
            PolicySpec(
                "session_affinity",
                SessionAffinityConfig,
                SessionAffinity,
                "sticky sessions, migrated over a load threshold",
            ),
            PolicySpec(
                "prefix_affinity",
                PrefixAffinityConfig,
                PrefixAffinity,
                "longest cached prefix unless overloaded (bounded loads)",
            ),
            PolicySpec(
                "cache_aware",
                CacheAwareConfig,
                CacheAware,
                "sglang-router's cache_aware, modelled: a match over 30%, else smallest tree",
            ),
            PolicySpec(
                "ttft",
                TtftConfig,
                TtftPolicy,
                "least predicted TTFT (speed learned per worker) plus eviction cost",
            ),
            PolicySpec(
                "consistent_hash",
                ConsistentHashConfig,
                ConsistentHash,
                "rendezvous hashing with bounded loads",
            ),
        ]
    )


def with_feature_blocks(
    registry: PolicyRegistry, name: str, options: Mapping[str, Any], features: FeatureConfig
) -> dict[str, Any]:
    """``options`` of policy ``name`` with its prefix index sized by ``features``' blocks.

    The index counts blocks of the chains ``features`` builds, so its
    ``block_chars`` must be theirs: it is filled in when unset (in token mode, as
    ``block_tokens`` × the index's ``chars_per_token``), and a different value set
    by hand is refused with ``ValueError``. Policies without an index are untouched.
    """
    merged = dict(options)
    if "index" not in registry[name].config.model_fields:
        return merged
    index = dict(merged.get("index") or {})
    if features.block_mode == "chars":
        block_chars = features.block_chars
    else:
        chars_per_token = float(index.get("chars_per_token", 4.0))
        block_chars = max(1, math.ceil(features.block_tokens * chars_per_token))
    given = index.get("block_chars")
    if given is None:
        index["block_chars"] = block_chars
    elif features.block_mode == "chars" and given != block_chars:
        raise ValueError(
            f"policy {name!r}: index.block_chars is {given} but features.block_chars is "
            f"{block_chars}; they must be equal (leave index.block_chars unset to follow "
            "features.block_chars)"
        )
    index.setdefault("fine_blocks", features.max_blocks)
    index.setdefault("coarse_factor", features.coarse_factor)
    merged["index"] = index
    return merged


def with_time_scale(
    registry: PolicyRegistry, name: str, options: Mapping[str, Any], time_scale: float
) -> dict[str, Any]:
    """``options`` of policy ``name`` running against a fleet ``time_scale`` times real time.

    A policy whose config has ``time_scale`` (its rates and times are the model's)
    gets it, unless set by hand; other policies are untouched. Harnesses that run
    emulated workers faster than real time pass their scale here.
    """
    merged = dict(options)
    if "time_scale" in registry[name].config.model_fields:
        merged.setdefault("time_scale", time_scale)
    return merged


__all__ = [
    "DEFAULT_POLICY",
    "PolicyRegistry",
    "PolicySpec",
    "UnknownPolicyError",
    "default_registry",
    "with_feature_blocks",
    "with_time_scale",
]
