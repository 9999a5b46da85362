"""The continuous-batching scheduler: a FCFS waiting queue and a running batch.

Each step (as vLLM v1): running sequences are scheduled first, in arrival order,
each taking the tokens it needs (one when decoding, a chunk of its uncached
prompt when prefilling) from the step's ``max_batched_tokens`` budget; a running
sequence that cannot get a block preempts the most recently arrived running one.
Then, if nothing was preempted, waiting requests are admitted in order while
sequences, budget and blocks allow; admission reuses the longest cached prefix
and restores offloaded blocks. Work is per block and per sequence, never per token.
"""

from __future__ import annotations

import math
from collections import deque

from kvgate.engine.blocks import BlockPool
from kvgate.engine.config import EngineConfig
from kvgate.engine.offload import OffloadStore
from kvgate.engine.records import EngineRequest, FinishedRequest, StepResult
from kvgate.engine.sequence import Sequence
from kvgate.engine.stats import Counters
from kvgate.types import BlockHash, Seconds

_GB = 1e9


class Scheduler:
    """Owns the waiting queue, the running batch, the block pool and the offload tiers."""

    __slots__ = (
        "_bs",
        "_caching",
        "_order",
        "_reserve",
        "config",
        "counters",
        "last_utilisation",
        "offload",
        "pool",
        "profile",
        "running",
        "sequences",
        "waiting",
    )

    def __init__(self, config: EngineConfig, counters: Counters) -> None:
        self.config = config
        self.profile = config.latency
        self.counters = counters
        self._bs = config.block_size
        self._caching = config.enable_prefix_caching
        self._reserve = not config.preemption
        self.offload = OffloadStore(
            config.cpu_offload_blocks,
            config.disk_offload_blocks,
            config.cpu_bandwidth_gb_s * _GB,
            config.disk_bandwidth_gb_s * _GB,
            config.kv_bytes_per_block,
        )
        auto = config.offload_on_evict and self.offload.enabled and self._caching
        self.pool = BlockPool(config.num_gpu_blocks, self._evicted if auto else None)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.sequences: dict[str, Sequence] = {}
        self._order = 0
        self.last_utilisation = 0.0

    # -- requests in and out ---------------------------------------------------------

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` tokens."""
        return -(-tokens // self._bs)

    def add(self, request: EngineRequest, now: Seconds) -> Sequence:
        """Queue a validated request at the tail of the waiting queue."""
        seq = Sequence(request, now, self._order, self._bs, self._caching)
        self._order += 1
        self.sequences[seq.request_id] = seq
        self.waiting.append(seq)
        return seq

    def abort(self, request_id: str) -> Sequence | None:
        """Drop a live request and free its blocks; None if it is not live."""
        seq = self.sequences.pop(request_id, None)
        if seq is None:
            return None
        if seq.num_blocks or seq.reserved:
            self._free(seq)
        if seq in self.running:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        return seq

    def _free(self, seq: Sequence) -> None:
        pool = self.pool
        # Tail blocks are released first, so they are evicted before the prefix
        # they extend (the prefix is what other requests share), as vLLM does.
        pool.release(reversed(seq.held))
        pool.private -= seq.num_blocks - len(seq.held)
        pool.reserved -= seq.reserved
        seq.held = []
        seq.num_blocks = 0
        seq.reserved = 0

    def _evicted(self, block: BlockHash) -> None:
        self.offload.put(block)
        self.counters.offloaded_blocks += 1

    # -- blocks -----------------------------------------------------------------------

    def _draw(self, seq: Sequence, blocks: int) -> None:
        """Charge ``blocks`` newly taken blocks against ``seq``'s reservation, if any."""
        take = min(blocks, seq.reserved)
        seq.reserved -= take
        self.pool.reserved -= take

    def _grow(self, seq: Sequence, target: int) -> bool:
        """Give ``seq`` blocks for its first ``target`` tokens; False, unchanged, if no room.

        Blocks that are full once ``target`` tokens are computed and have a hash in
        the request's chain become cached (shared with any request that has the
        same hash); the rest are private.
        """
        pool = self.pool
        bs = self._bs
        held = seq.held
        nb = seq.num_blocks
        full = target // bs
        full = min(full, seq.n_hashable)
        hashes = seq.hashes
        # A held private block that becomes full this step joins the cache.
        while len(held) < full and len(held) < nb:
            block = hashes[len(held)]
            pool.promote(block)
            held.append(block)
        need = -(-target // bs) - nb
        if need <= 0:
            return True
        # Counting every new block as one that must be taken is pessimistic only
        # when a later block of the chain is already cached; it keeps this O(1).
        if need > pool.available(seq.reserved):
            return False
        self._draw(seq, need)
        new_hashed = hashes[nb:full] if len(held) == nb and full > nb else ()
        missing: list[BlockHash] = []
        refs = pool.refs
        for block in new_hashed:
            if block in refs:
                pool.ref(block)  # before make_room, so it cannot be evicted under us
            else:
                missing.append(block)
        pool.make_room(len(missing) + need - len(new_hashed))
        for block in missing:
            pool.insert(block)
        pool.private += need - len(new_hashed)
        held.extend(new_hashed)
        seq.num_blocks = nb + need
        return True

    def _preempt(self, seq: Sequence, result: StepResult) -> None:
        """Recompute preemption: free everything, back to the head of the waiting queue."""
        self._free(seq)
        seq.computed = 0
        seq.preemptions += 1
        self.counters.preemptions += 1
        self.waiting.appendleft(seq)
        result.preempted.append(seq.request_id)

    def _admit(self, seq: Sequence, budget: int) -> tuple[int, float] | None:
        """Start ``seq`` with up to ``budget`` tokens: (tokens scheduled, restore seconds).

        None, with nothing changed, when its blocks do not fit.
        """
        pool = self.pool
        bs = self._bs
        total = seq.prompt + seq.output
        # At least one token is always computed (its logits give the next token).
        limit = min(seq.n_hashable, (total - 1) // bs)
        hashes = seq.hashes
        refs = pool.refs
        offload = self.offload
        matched = 0
        grabs = 0
        in_use_hits = 0
        restores: list[BlockHash] = []
        while matched < limit:
            block = hashes[matched]
            count = refs.get(block)
            if count is not None:
                if count == 0:
                    grabs += 1
                else:
                    in_use_hits += 1
            elif block in offload:
                restores.append(block)
            else:
                break
            matched += 1
        computed = matched * bs
        n = min(total - computed, budget)
        cost = grabs + len(restores) + self.blocks_for(computed + n) - matched
        if self._reserve:
            worst = self.blocks_for(seq.prompt + seq.max_tokens) - in_use_hits
            if worst > pool.available():
                return None
            seq.reserved = worst
            pool.reserved += worst
        elif cost > pool.available():
            return None
        # Commit: hits first (so making room cannot evict them), then restores.
        gpu_hits = matched - len(restores)
        if restores:
            for block in hashes[:matched]:
                if block in refs:
                    pool.ref(block)
            # Out of the tier before making room: blocks evicted to make room may be
            # offloaded into the same tier and would push these out.
            seconds = 0.0
            for block in restores:
                seconds += offload.take(block)
            pool.make_room(len(restores))
            for block in restores:
                pool.insert(block)
            self.counters.restored_blocks += len(restores)
        else:
            for block in hashes[:matched]:
                pool.ref(block)
            seconds = 0.0
        self._draw(seq, grabs + len(restores))
        seq.held = list(hashes[:matched])
        seq.num_blocks = matched
        seq.computed = computed
        counters = self.counters
        counters.prefix_queries += total
        counters.prefix_hits += gpu_hits * bs
        if seq.cached_tokens < 0:
            seq.cached_tokens = computed
        if not self._grow(seq, computed + n):
            n = 0  # only when the pessimistic room check was too optimistic; next step
        return n, seconds

    # -- the step ---------------------------------------------------------------------

    def step(self, now: Seconds, horizon: Seconds | None) -> StepResult:
        """Run one scheduler iteration (or several fused decode-only ones) from ``now``."""
        result = StepResult()
        restored_before = self.counters.restored_blocks
        budget = self.config.max_batched_tokens
        bs = self._bs
        running = self.running
        scheduled: list[Sequence] = []
        prefill_tokens = 0
        decode_seqs = 0
        context_tokens = 0
        transfer = 0.0
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = seq.prompt + seq.output - seq.computed
            if n > budget:  # noqa: PLR1730 -- hot loop: a branch is cheaper than min()
                n = budget
            target = seq.computed + n
            # Most decode steps need no new block and no promotion: skip _grow.
            if (target > seq.num_blocks * bs or len(seq.held) < seq.n_hashable) and not self._grow(
                seq, target
            ):
                if self._reserve:
                    i += 1  # cannot happen with reservations; skip rather than spin
                    continue
                victim = running[-1]
                while True:
                    running.pop()
                    self._preempt(victim, result)
                    if victim is seq or self._grow(seq, target):
                        break
                    victim = running[-1]
                if victim is seq:
                    break
            seq.scheduled = n
            scheduled.append(seq)
            budget -= n
            if n == 1 and seq.output and seq.computed + 1 == seq.prompt + seq.output:
                decode_seqs += 1
                context_tokens += target
            else:
                prefill_tokens += n
            i += 1
        fully_scheduled = i == len(running)
        if not result.preempted:
            waiting = self.waiting
            max_seqs = self.config.max_num_seqs
            while waiting and len(running) < max_seqs and budget > 0:
                seq = waiting[0]
                admitted = self._admit(seq, budget)
                if admitted is None:
                    break
                n, seconds = admitted
                waiting.popleft()
                running.append(seq)
                transfer += seconds
                seq.scheduled = n
                scheduled.append(seq)
                budget -= n
                prefill_tokens += n
        if not scheduled:
            self.last_utilisation = 0.0
            return result
        steps = 1
        duration = self.profile.step_time(prefill_tokens, decode_seqs, context_tokens) + transfer
        if (
            horizon is not None
            and decode_seqs == len(scheduled)
            and fully_scheduled
            and not result.preempted
            and len(running) == decode_seqs
        ):
            steps, duration = self._fuse(scheduled, context_tokens, horizon, duration)
        result.duration = duration
        result.steps = steps
        result.prefill_tokens = prefill_tokens
        result.restored_blocks = self.counters.restored_blocks - restored_before
        self.counters.steps += steps
        self.last_utilisation = (prefill_tokens + decode_seqs) / self.config.max_batched_tokens
        self._apply(scheduled, steps, now + duration, result)
        return result

    def _fuse(
        self, seqs: list[Sequence], context_tokens: int, horizon: Seconds, one_step: Seconds
    ) -> tuple[int, Seconds]:
        """How many decode-only steps to fuse, and their total duration.

        Step j (from 0) costs ``a + b * j``: every sequence's context grows by one
        token a step. Stops before ``horizon`` is passed, at the first finish, and
        where blocks for the growing contexts run out.
        """
        k = min(seq.max_tokens - seq.output for seq in seqs)
        if k <= 1 or one_step >= horizon:
            return 1, one_step
        n = len(seqs)
        a = one_step
        b = self.profile.attention_per_ctx_token_s * n
        if b > 0:
            half = a - b / 2
            k_h = int((-half + math.sqrt(half * half + 2 * b * horizon)) / b)
        else:
            k_h = int(horizon / a)
        while k_h > 1 and k_h * a + b * k_h * (k_h - 1) / 2 > horizon:
            k_h -= 1  # float rounding of the root
        k = max(1, min(k, k_h))
        if k > 1:
            k = self._fit_blocks(seqs, k)
            bs = self._bs
            for seq in seqs:
                # Room was checked for all of them together in _fit_blocks.
                if seq.computed + k > seq.num_blocks * bs:
                    self._grow(seq, seq.computed + k)
        return k, k * a + b * k * (k - 1) / 2

    def _fit_blocks(self, seqs: list[Sequence], k: int) -> int:
        """The largest k' <= k for which every sequence can hold ``computed + k'`` tokens."""
        bs = self._bs
        pool = self.pool

        def extra(steps: int) -> int:
            total = 0
            for seq in seqs:
                more = -(-(seq.computed + steps) // bs) - seq.num_blocks
                if more > 0:
                    total += more if not seq.reserved else max(0, more - seq.reserved)
            return total

        room = pool.available()
        # No sequence needs more than this many new blocks for k more tokens.
        if len(seqs) * (k // bs + 1) <= room or extra(k) <= room:
            return k
        lo, hi = 1, k  # extra(1) == 0: the first step's blocks are already held
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if extra(mid) <= room:
                lo = mid
            else:
                hi = mid
        return lo

    def _apply(self, seqs: list[Sequence], steps: int, end: Seconds, result: StepResult) -> None:
        """Advance the scheduled sequences by the step's work; emit tokens and finishes."""
        counters = self.counters
        tokens = result.tokens
        for seq in seqs:
            n = seq.scheduled
            if steps > 1:
                seq.computed += steps
                seq.output += steps
                tokens[seq.request_id] = steps
                counters.generation_tokens += steps
            else:
                seq.computed += n
                if seq.computed != seq.prompt + seq.output:
                    continue  # prefill chunk that did not reach the end
                seq.output += 1
                tokens[seq.request_id] = 1
                counters.generation_tokens += 1
                if seq.output == 1:
                    seq.first_token_time = end
                    result.first_tokens.append((seq.request_id, seq.cached_tokens))
                    counters.prompt_tokens += seq.prompt
                    counters.ttft.observe(end - seq.arrival)
            if seq.output >= seq.max_tokens:
                self._finish(seq, end, result)

    def _finish(self, seq: Sequence, end: Seconds, result: StepResult) -> None:
        self._cache_output(seq)
        self._free(seq)
        self.running.remove(seq)
        del self.sequences[seq.request_id]
        counters = self.counters
        counters.finished += 1
        counters.e2e.observe(end - seq.arrival)
        result.finished.append(
            FinishedRequest(
                request_id=seq.request_id,
                session_id=seq.request.session_id,
                prompt_tokens=seq.prompt,
                cached_tokens=max(seq.cached_tokens, 0),
                output_tokens=seq.output,
                arrival=seq.arrival,
                first_token_time=seq.first_token_time,
                finish_time=end,
                preemptions=seq.preemptions,
            )
        )

    def _cache_output(self, seq: Sequence) -> None:
        """Cache the full output blocks whose hashes the request supplied (vLLM caches them)."""
        out = seq.request.output_block_hashes
        if (
            not out
            or not self._caching
            or len(seq.held) != seq.n_hashable
            or seq.n_hashable != seq.prompt // self._bs
        ):
            return
        full = min(seq.computed // self._bs, seq.num_blocks)
        for block in out[: max(0, full - len(seq.held))]:
            self.pool.promote(block)
            seq.held.append(block)
