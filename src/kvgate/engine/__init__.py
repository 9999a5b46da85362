"""The pure model of one inference engine (vLLM-like): paged KV cache with prefix
caching, LRU eviction and offload tiers; a continuous-batching scheduler; a latency
model and a GPU model. No I/O: time is passed in.
"""

from kvgate.engine.config import EngineConfig
from kvgate.engine.engine import Engine, Residency
from kvgate.engine.records import EngineRequest, FinishedRequest, OffloadResult, StepResult
from kvgate.engine.stats import EngineStats, HistogramSnapshot

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineRequest",
    "EngineStats",
    "FinishedRequest",
    "HistogramSnapshot",
    "OffloadResult",
    "Residency",
    "StepResult",
]
