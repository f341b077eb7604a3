"""Each side's servers, timing their requests against the side's latency target (ray_pods/latency_stats.py).

`build_pd_openai_app` (ray_pods/selective_pd.py) runs these where Ray's builder names PDPrefillServer and
PDDecodeServer. What is measured, where:

- Prefill (`LatencyPrefillServer`): the prefill leg, from the request entering the prefill replica to its response:
  the engine's queue wait and the prefill itself. A request waiting in Serve's queue at decode's handle, before any
  prefill replica took it, is not in it. Prefill sees split requests only: a short prompt decode prefills itself
  never reaches it, and its first token is decode's.
- Decode (`LatencyPDDecodeServer`): a streamed request's mean gap between its output items (the engine's streamed
  strings, counted inside Ray's batches of them, llm_server.py Batcher): the time from its first batch to its
  last over its items less one. Batching moves it by at most one batch interval (stream_batching_interval_ms, 10
  ms in pd_application.yaml) over the stream; vLLM's role line, sent with the first token, and a usage line count
  as items, so a short output's mean is a little low.
  Local-prefill requests are counted like the others: a prompt decode prefills stalls the other streams, which
  shows in their gaps; decode also reports how many it prefilled itself. A request answered in one piece (not
  streamed) has no gaps and is not counted. And decode's KV-cache use, from the stats vLLM's engine hands its stat
  loggers each step in this process (vllm/v1/engine/async_llm.py, output_handler), when vLLM keeps stats (it does
  unless disable_log_stats).

A replica with no target in its user_config times nothing and reports nothing: it runs as Ray's and the product's
classes do. Its user_config is absent (prefill without a target) or holds only decode's threshold.
"""

# No `from __future__ import annotations`: Serve and pydantic may read these signatures at run time.
import contextlib
import logging
import time
from collections.abc import AsyncGenerator
from typing import Any

from ray.llm._internal.serve.core.configs.openai_api_models import ErrorResponse
from ray.llm._internal.serve.core.protocol import RawRequestInfo
from ray.llm._internal.serve.serving_patterns.prefill_decode.pd_server import PDPrefillServer
from ray.serve.metrics import Counter
from vllm.v1.metrics.loggers import StatLoggerBase

from ray_pods.latency_stats import (
    ALLOWED_OVER_FRACTION,
    KV_CACHE_USAGE,
    LOCAL_PREFILLS,
    OVER_TARGET,
    REQUESTS,
    REQUESTS_METRIC,
    SlidingCount,
    target_of,
)
from ray_pods.selective_pd import LOCAL, SelectivePDDecodeServer

logger = logging.getLogger("ray.serve")

PREFILL, DECODE = "prefill", "decode"
# vLLM's last line of a stream; it carries no token.
_STREAM_END = "data: [DONE]"


def is_error(chunk: Any) -> bool:
    if isinstance(chunk, list):
        return any(isinstance(item, ErrorResponse) for item in chunk)
    return isinstance(chunk, ErrorResponse)


def stream_items(chunk: Any) -> int:
    """A streamed chunk's output items (Ray hands a stream's strings on in lists); 0 for a whole response or an
    error."""
    if isinstance(chunk, str):
        return 0 if chunk.startswith(_STREAM_END) else 1
    if isinstance(chunk, list):
        return sum(stream_items(item) for item in chunk)
    return 0


class LatencyReporting:
    """A side's target from its user_config, its requests counted against it, and Serve's autoscaling report."""

    _latency_side = ""
    _target_ms: float | None = None
    _allowed_over = 0.0
    _finished: SlidingCount | None = None
    _over: SlidingCount | None = None
    _latency_requests: Counter | None = None

    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve calls this after the constructor and on every change of the deployment's user_config."""
        parent = getattr(super(), "reconfigure", None)
        if parent is not None:  # decode's threshold (ray_pods/selective_pd.py)
            await parent(user_config)
        target = target_of(user_config)
        self._target_ms, self._allowed_over = (None, 0.0) if target is None else target
        if target is not None:
            logger.info("%s latency target %.0f ms, %.3f of the requests allowed over it", self._latency_side, *target)

    def _record_latency(self, measured_ms: float) -> None:
        """One finished request, counted against the target in force when it finished."""
        if self._target_ms is None:
            return
        now = time.monotonic()
        over = measured_ms > self._target_ms
        if self._finished is None or self._over is None:
            self._finished, self._over = SlidingCount(), SlidingCount()
        self._finished.add(now)
        if over:
            self._over.add(now)
        if self._latency_requests is None:
            self._latency_requests = Counter(
                REQUESTS_METRIC,
                description="Requests timed against the side's latency target, by whether they were over it.",
                tag_keys=("side", "over_target"),
            )
        self._latency_requests.inc(tags={"side": self._latency_side, "over_target": "yes" if over else "no"})

    def _side_stats(self, now: float) -> dict[str, float]:
        return {}

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metrics: the last window's counts; nothing without a target."""
        if self._target_ms is None:
            return {}
        now = time.monotonic()
        stats = {
            REQUESTS: float(0 if self._finished is None else self._finished.count(now)),
            OVER_TARGET: float(0 if self._over is None else self._over.count(now)),
            ALLOWED_OVER_FRACTION: self._allowed_over,
        }
        stats.update(self._side_stats(now))
        return stats


class LatencyPrefillServer(LatencyReporting, PDPrefillServer):  # type: ignore[misc]  # Ray ships no type information
    """Ray's prefill server, timing each request from entering the replica to its response."""

    _latency_side = PREFILL

    async def chat(self, request: Any, raw_request_info: RawRequestInfo | None = None) -> AsyncGenerator[Any, None]:
        entered = time.monotonic()
        stream = await super().chat(request, raw_request_info)
        return stream if self._target_ms is None else self._timed_to_response(stream, entered)

    async def completions(
        self, request: Any, raw_request_info: RawRequestInfo | None = None
    ) -> AsyncGenerator[Any, None]:
        entered = time.monotonic()
        stream = await super().completions(request, raw_request_info)
        return stream if self._target_ms is None else self._timed_to_response(stream, entered)

    async def _timed_to_response(self, stream: AsyncGenerator[Any, None], entered: float) -> AsyncGenerator[Any, None]:
        answered = False
        async with contextlib.aclosing(stream):  # as in LatencyPDDecodeServer: closed with this generator
            async for chunk in stream:
                if not answered:
                    answered = True
                    # An error's time is not a prefill's: a quick refusal counted as fast would hide slow prefills.
                    if not is_error(chunk):
                        self._record_latency((time.monotonic() - entered) * 1000)
                yield chunk


class KvCacheUsage(StatLoggerBase):  # type: ignore[misc]  # vLLM's loggers are untyped
    """A vLLM stat logger keeping the KV-cache use of the engine's last step. The scheduler makes its stats after
    freeing the blocks of the requests that finished (v1/core/sched/scheduler.py, update_from_output), so an idle
    engine's last value is its use once drained, not a burst's peak."""

    def __init__(self) -> None:  # vLLM passes a logger factory its config; this one is added by hand and needs none
        self.usage: float | None = None

    def record(
        self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
    ) -> None:
        if scheduler_stats is not None:
            self.usage = float(scheduler_stats.kv_cache_usage)

    def log_engine_initialized(self) -> None:
        pass


class LatencyPDDecodeServer(LatencyReporting, SelectivePDDecodeServer):
    """The product's decode server, timing each streamed request's gaps and counting the prompts it prefills."""

    _latency_side = DECODE
    _local: SlidingCount | None = None
    _kv: KvCacheUsage | None = None

    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        await super().reconfigure(user_config)
        if self._target_ms is not None and self._kv is None:
            self._kv = self._watch_kv_cache()

    def _watch_kv_cache(self) -> KvCacheUsage | None:
        """A stat logger added to the running engine's own: vLLM calls each in its list every step."""
        manager = getattr(getattr(self.engine, "_engine_client", None), "logger_manager", None)
        if manager is None:
            logger.warning("vLLM keeps no stats (disable_log_stats): decode reports no %s", KV_CACHE_USAGE)
            return None
        watcher = KvCacheUsage()
        manager.stat_loggers.append(watcher)
        return watcher

    def _count_request(self, route: str, reason: str) -> None:
        super()._count_request(route, reason)
        if route == LOCAL and self._target_ms is not None:
            if self._local is None:
                self._local = SlidingCount()
            self._local.add(time.monotonic())

    def _side_stats(self, now: float) -> dict[str, float]:
        stats = {LOCAL_PREFILLS: float(0 if self._local is None else self._local.count(now))}
        if self._kv is not None and self._kv.usage is not None:
            stats[KV_CACHE_USAGE] = self._kv.usage
        return stats

    async def _pd_handle_request(
        self, request: Any, raw_request_info: RawRequestInfo | None = None
    ) -> AsyncGenerator[Any, None]:
        # Closed with this generator, not later by the garbage collector: a client that leaves ends the engine's
        # request (vLLM aborts it as its generator closes) as promptly as without this wrapper.
        async with contextlib.aclosing(super()._pd_handle_request(request, raw_request_info)) as stream:
            if self._target_ms is None:
                async for chunk in stream:
                    yield chunk
                return
            first_at = last_at = 0.0
            items = 0
            try:
                async for chunk in stream:
                    arrived = stream_items(chunk)
                    if arrived:
                        last_at = time.monotonic()
                        first_at = first_at or last_at
                        items += arrived
                    yield chunk
            finally:
                # Over the items' gaps, not the chunks': a batch holds the items produced since the last one, so a
                # stream produced inside one batch interval has gaps near 0, not none. A stream cut short (the
                # client left) measured its gaps until then.
                if items > 1:
                    self._record_latency((last_at - first_at) * 1000 / (items - 1))
