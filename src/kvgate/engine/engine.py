"""``Engine``: the pure model of one inference engine (vLLM-like), driven with injected time.

The live emulated worker calls ``step`` in real time, one scheduler iteration at a
time; the simulator calls it in virtual time with a ``horizon`` so consecutive
decode-only iterations are fused. Both get the same model.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvgate.engine.config import EngineConfig
from kvgate.engine.gpu import GpuThermal
from kvgate.engine.profiles import MIB
from kvgate.engine.records import EngineRequest, OffloadResult, StepResult
from kvgate.engine.scheduler import Scheduler
from kvgate.engine.stats import Counters, EngineStats
from kvgate.types import BlockHash, Seconds

# The busy fraction of a step that batches nothing still heats the GPU: decode is
# memory-bound but draws well over half of board power on real devices.
_BASE_UTILISATION = 0.6


@dataclass(frozen=True, slots=True)
class Residency:
    """Where one session's blocks are: on the GPU, in the CPU or disk tier, or nowhere."""

    gpu: int
    cpu: int
    disk: int
    missing: int


class Engine:
    """One inference engine: paged KV cache with prefix caching, a batching scheduler,
    offload tiers, a latency model and a GPU model. Pure: time is always passed in.
    """

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config if config is not None else EngineConfig()
        self._counters = Counters()
        self._scheduler = Scheduler(self.config, self._counters)
        self._thermal = GpuThermal(
            self.config.idle_temp_c, self.config.max_temp_c, self.config.thermal_time_constant_s
        )
        self._sessions: OrderedDict[str, EngineRequest] = OrderedDict()
        self._busy_until: Seconds = float("-inf")
        self._busy_utilisation = 0.0
        self._speed = 1.0

    # -- requests ---------------------------------------------------------------------

    def fits(self, prompt_tokens: int, max_tokens: int) -> bool:
        """True when a request of this size could ever run here (its KV fits the GPU)."""
        return self._scheduler.blocks_for(prompt_tokens + max_tokens) <= self.config.num_gpu_blocks

    def alone_ttft(self, prompt_tokens: int, cached_tokens: int) -> Seconds:
        """Model seconds to the first token of a prompt prefilled alone on an idle engine
        with ``cached_tokens`` of it cached: its uncached tokens in ``max_batched_tokens``
        chunks, one step each, nothing queued ahead and nothing batched beside it.

        What no placement can cut from that request's TTFT, given the cache it got: the
        simulator's ``ttft_floor_p99`` is the p99 of it over the requests served.
        Restoring offloaded blocks is not counted.
        """
        left = prompt_tokens - cached_tokens
        chunk = self.config.max_batched_tokens
        profile = self._scheduler.profile
        seconds = 0.0
        while left > 0:
            n = chunk if left > chunk else left
            seconds += profile.step_time(n, 0, 0)
            left -= n
        return seconds

    @property
    def speed(self) -> float:
        """The engine's speed as a share of its profile's (1.0 unless ``set_speed`` changed it)."""
        return self._speed

    def set_speed(self, speed: float) -> None:
        """Run every later step at ``speed`` times the profile's rate (0.5: half speed).

        The driver calls it at the time the device changes (a worker slowed mid-run);
        a step already running keeps the duration it was given.
        """
        self._scheduler.profile = self.config.latency.scaled(speed)
        self._speed = speed

    def submit(self, request: EngineRequest, now: Seconds) -> None:
        """Queue ``request`` (arrival time ``now``) at the tail of the waiting queue.

        Raises ``ValueError`` for a request id already live, non-positive token
        counts, or a request whose prompt and ``max_tokens`` cannot fit in the whole
        KV cache (vLLM refuses those too, as longer than the model's max length).
        """
        if request.request_id in self._scheduler.sequences:
            raise ValueError(f"request {request.request_id!r} is already in the engine")
        if request.prompt_tokens < 1 or request.max_tokens < 1:
            raise ValueError("prompt_tokens and max_tokens must be >= 1")
        if not self.fits(request.prompt_tokens, request.max_tokens):
            raise ValueError(
                f"request {request.request_id!r} needs "
                f"{request.prompt_tokens + request.max_tokens} tokens of KV cache; "
                f"the engine holds {self.config.kv_capacity_tokens}"
            )
        self._scheduler.add(request, now)
        if request.session_id is not None:
            sessions = self._sessions
            sessions[request.session_id] = request
            sessions.move_to_end(request.session_id)
            if len(sessions) > self.config.max_tracked_sessions:
                sessions.popitem(last=False)

    def abort(self, request_id: str, now: Seconds) -> bool:
        """Drop a live request (the client went away) and free its blocks; False if unknown."""
        self._thermal.advance(now, 0.0)
        if self._scheduler.abort(request_id) is None:
            return False
        self._counters.aborted += 1
        return True

    def has_work(self) -> bool:
        """True while any request is waiting or running."""
        return bool(self._scheduler.sequences)

    def is_live(self, request_id: str) -> bool:
        """True while ``request_id`` is waiting or running."""
        return request_id in self._scheduler.sequences

    def step(self, now: Seconds, horizon: Seconds | None = None) -> StepResult:
        """Run one scheduler iteration starting at ``now``; see ``StepResult``.

        With ``horizon`` set, consecutive decode-only iterations with nothing
        admissible waiting are fused, up to ``now + horizon`` or the next finish
        (at least one iteration runs). The driver calls again at ``now + duration``.
        A result with ``steps == 0`` means there was nothing to run.
        """
        thermal = self._thermal
        thermal.advance(now, 0.0)
        result = self._scheduler.step(now, horizon)
        if result.steps:
            load = min(1.0, self._scheduler.last_utilisation)
            utilisation = _BASE_UTILISATION + (1 - _BASE_UTILISATION) * load
            thermal.advance(now + result.duration, utilisation)
            self._busy_until = now + result.duration
            self._busy_utilisation = utilisation
        return result

    # -- offload ----------------------------------------------------------------------

    def offload(
        self,
        session_ids: Iterable[str] = (),
        block_hashes: Iterable[BlockHash] = (),
        now: Seconds = 0.0,
        *,
        copy: bool = False,
    ) -> OffloadResult:
        """Move the named sessions' and blocks' cached KV that no request holds off the GPU.

        Blocks go to the CPU tier (then disk, LRU), or are dropped when there is
        no offload capacity. A later request whose chain reaches them brings them
        back for their transfer time instead of recomputing them.

        ``copy``: copy them to the tier and leave them on the GPU as cached KV (in use
        or not), as a KV connector stores a finished request's blocks: a request that
        finds them still there pays nothing, one that finds them evicted restores
        them. A backup, not a relief: it frees no GPU block.
        """
        self._thermal.advance(now, 0.0)
        wanted: dict[BlockHash, None] = {}
        for session_id in session_ids:
            wanted.update(dict.fromkeys(self.session_blocks(session_id)))
        wanted.update(dict.fromkeys(block_hashes))
        pool = self._scheduler.pool
        store = self._scheduler.offload
        offloaded = copied = dropped = in_use = not_resident = 0
        seconds = 0.0
        # Tail blocks first, so a chain's head is the most recent entry of the tier
        # and the last to be demoted or dropped.
        for block in reversed(list(wanted)):
            count = pool.refs.get(block)
            if count is None:
                not_resident += 1
            elif count and not copy:
                in_use += 1
            elif copy:
                cost = store.put(block)
                if cost is not None:
                    copied += 1
                    seconds += cost
            else:
                pool.discard(block)
                cost = store.put(block)
                if cost is None:
                    dropped += 1
                else:
                    offloaded += 1
                    seconds += cost
        self._counters.offloaded_blocks += offloaded + copied
        return OffloadResult(offloaded, dropped, in_use, not_resident, seconds, copied)

    def forget(self, block_hashes: Iterable[BlockHash]) -> int:
        """Drop these cached blocks that no request holds (overwritten); returns how many.

        What llama.cpp does to a slot's KV when another prompt takes the slot or
        the slot is erased: the blocks are gone, not offloaded.
        """
        pool = self._scheduler.pool
        return sum(1 for block in block_hashes if pool.discard(block))

    def adopt(self, block_hashes: Sequence[BlockHash]) -> int:
        """Put a chain of blocks on the GPU as cached, evictable KV; returns how many.

        A restored llama.cpp slot: its KV is loaded as if computed, so the next
        request whose chain reaches it hits it. Blocks already cached are kept;
        room is made by evicting the least recently used blocks, and the chain
        stops where no room is left (a longer prefix would not be reusable).
        """
        pool = self._scheduler.pool
        adopted: list[BlockHash] = []
        for block in block_hashes:
            if block in pool.refs:
                pool.ref(block)
            elif pool.available() > 0:
                pool.make_room(1)
                pool.insert(block)
            else:
                break
            adopted.append(block)
        pool.release(adopted)
        return len(adopted)

    def record_kv_events(self) -> None:
        """From now on, journal every block entering or leaving the GPU cache
        (``drain_kv_events``): what the engine publishes as KV events."""
        pool = self._scheduler.pool
        if pool.journal is None:
            pool.journal = []

    def drain_kv_events(self) -> list[tuple[bool, BlockHash]]:
        """Blocks cached ``(True, hash)`` and evicted ``(False, hash)`` since the last
        drain, in order (empty unless ``record_kv_events`` was called)."""
        pool = self._scheduler.pool
        journal = pool.journal
        if not journal:
            return []
        pool.journal = []
        return journal

    def cached_blocks(self) -> set[BlockHash]:
        """Every block in the GPU cache now (what its KV events must add up to)."""
        return set(self._scheduler.pool.refs)

    def holds(self, block: BlockHash) -> bool:
        """Whether ``block`` is in the GPU cache now."""
        return block in self._scheduler.pool.refs

    def reset_prefix_cache(self) -> int:
        """Forget every cached block no request holds (vLLM's reset); returns how many."""
        return self._scheduler.pool.clear_evictable()

    # -- read access ------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        """Requests in the running batch."""
        return len(self._scheduler.running)

    @property
    def num_waiting(self) -> int:
        """Requests in the waiting queue (preempted ones included)."""
        return len(self._scheduler.waiting)

    @property
    def kv_usage(self) -> float:
        """Fraction of GPU blocks in use, 0..1."""
        pool = self._scheduler.pool
        return pool.num_in_use / pool.capacity

    def session_ids(self) -> list[str]:
        """Sessions the engine remembers, least recently active first (bounded)."""
        return list(self._sessions)

    def session_blocks(self, session_id: str) -> list[BlockHash]:
        """The cacheable block hashes of the session's latest request, in chain order."""
        request = self._sessions.get(session_id)
        if request is None:
            return []
        full = request.prompt_tokens // self.config.block_size
        blocks = list(request.block_hashes[:full])
        if len(blocks) == full:
            blocks.extend(request.output_block_hashes)
        return blocks

    def block_location(self, block: BlockHash) -> str | None:
        """``"gpu"``, ``"cpu"``, ``"disk"`` or None: where a cached block is."""
        if block in self._scheduler.pool.refs:
            return "gpu"
        return self._scheduler.offload.locate(block)

    def residency(self, session_id: str) -> Residency:
        """Where the session's blocks are now."""
        counts = {"gpu": 0, "cpu": 0, "disk": 0}
        missing = 0
        for block in self.session_blocks(session_id):
            where = self.block_location(block)
            if where is None:
                missing += 1
            else:
                counts[where] += 1
        return Residency(counts["gpu"], counts["cpu"], counts["disk"], missing)

    def cached_prefix_tokens(self, block_hashes: Sequence[BlockHash], prompt_tokens: int) -> int:
        """Tokens of this prompt a request admitted now would find on the GPU (no side effects)."""
        if not self.config.enable_prefix_caching:
            return 0
        bs = self.config.block_size
        limit = min(len(block_hashes), (prompt_tokens - 1) // bs)
        return self._scheduler.pool.match(block_hashes, max(limit, 0)) * bs

    def stats(self, now: Seconds) -> EngineStats:
        """Counters and gauges at ``now``, in vLLM's and DCGM's terms."""
        temp = self._thermal.advance(now, 0.0)
        config = self.config
        scheduler = self._scheduler
        pool = scheduler.pool
        counters = self._counters
        in_use = pool.num_in_use
        return EngineStats(
            running=len(scheduler.running),
            waiting=len(scheduler.waiting),
            kv_usage=in_use / pool.capacity,
            num_gpu_blocks=pool.capacity,
            block_size=config.block_size,
            gpu_blocks_in_use=in_use,
            gpu_blocks_cached=pool.num_evictable,
            prefix_cache_queries=counters.prefix_queries,
            prefix_cache_hits=counters.prefix_hits,
            preemptions=counters.preemptions,
            requests_finished=counters.finished,
            requests_aborted=counters.aborted,
            prompt_tokens_total=counters.prompt_tokens,
            generation_tokens_total=counters.generation_tokens,
            ttft=counters.ttft.snapshot(),
            e2e=counters.e2e.snapshot(),
            offloaded_blocks=counters.offloaded_blocks,
            restored_blocks=counters.restored_blocks,
            evicted_blocks=pool.evictions,
            cpu_offload_blocks_used=len(scheduler.offload.cpu),
            disk_offload_blocks_used=len(scheduler.offload.disk),
            gpu_temp_c=temp,
            gpu_mem_used_mib=config.weights_mib + in_use * config.kv_bytes_per_block / MIB,
            gpu_mem_total_mib=config.gpu_total_mib,
            gpu_utilisation=self._busy_utilisation if now < self._busy_until else 0.0,
            steps=counters.steps,
        )
