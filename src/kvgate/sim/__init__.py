"""The discrete-event cluster simulator: the real policies against ``engine`` workers.

Workloads and traces (``kvgate.workload``) stream ``SimRequest``s; a
``Simulation`` drives the gateway's decision flow (``gateway``) and one engine
per worker in virtual time; ``experiment`` compares policies against the
infinite-cache bound; ``report`` and ``plots`` write the results.
``kvgate sim`` (``command``) is the command line over all of it.
"""

from kvgate.sim.experiment import Experiment
from kvgate.sim.simulation import RunResult, SimConfig, Simulation
from kvgate.workload.bound import Bound, infinite_cache_bound
from kvgate.workload.options import workload_factory
from kvgate.workload.request import SimRequest
from kvgate.workload.synthetic import build_workload
from kvgate.workload.traces import MooncakeTrace, RagPulseTrace, open_trace

__all__ = [
    "Bound",
    "Experiment",
    "MooncakeTrace",
    "RagPulseTrace",
    "RunResult",
    "SimConfig",
    "SimRequest",
    "Simulation",
    "build_workload",
    "infinite_cache_bound",
    "open_trace",
    "workload_factory",
]
