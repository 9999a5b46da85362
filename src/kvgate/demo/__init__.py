"""``kvgate demo``: the product's main job on embedded defaults, in well under a minute.

An emulated fleet (``fleet``) runs in this process; each routing policy in turn
is put in front of it through the real gateway, and the same multi-turn chat
workload is replayed live (``kvgate.bench``). One table (``table``) compares
cache hit rate, latency and load spread as measured. With ``--real-workers`` the
fleet is real llama.cpp workers in child processes instead (``llamacpp_fleet``).
"""

from kvgate.demo.fleet import (
    EmulatedFleet,
    Fleet,
    FleetFactory,
    FleetSpec,
    emulated_fleet,
    llamacpp_fleet,
    real_spec,
)
from kvgate.demo.runner import DEFAULT_POLICIES, DEMO_WORKLOAD, DemoConfig, run_demo

__all__ = [
    "DEFAULT_POLICIES",
    "DEMO_WORKLOAD",
    "DemoConfig",
    "EmulatedFleet",
    "Fleet",
    "FleetFactory",
    "FleetSpec",
    "emulated_fleet",
    "llamacpp_fleet",
    "real_spec",
    "run_demo",
]
