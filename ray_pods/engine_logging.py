"""vLLM's and NIXL's logging set up before Serve's in each engine replica, so that a restarted controller keeps it.

Ray's worker process calls `import_logging_first` as it starts, before the replica exists: the engine replicas'
runtime_env names it in the variable Ray reads for a job's `worker_process_setup_hook` (serve_config/endpoint_keys.py,
SETUP_HOOK_ENV).

Why: two libraries in an engine replica configure logging with `logging.config.dictConfig`, which closes every
handler that exists at that moment:
- vLLM 0.26, when `vllm.logger` is first imported (vllm/logger.py, `_configure_vllm_root_logger`);
- NIXL 1.3's Python package, when it is first imported (nixl_cu13/logging.py, `setup_logging`), which vLLM does when
  it builds the engine's config with the NixlConnector (vllm/distributed/nixl_utils.py).
Both come when the engine starts, after Serve 2.58's replica has set up its logger (serve/_private/replica.py,
`_configure_logger_and_profilers`), and closing Serve's `MemoryHandler` drops its target. From then on:
- Serve's own log lines from that replica reach no file, and its buffer is never emptied;
- a Serve controller that starts again (a lost Ray head under GCS fault tolerance) recovers each replica by calling
  its `is_allocated`, which reads the handler's target (logging_utils.py, `get_component_logger_file_path`). The
  call raises, and the controller replaces every engine replica: one engine start's pause for every request.
Importing both here runs their dictConfig before Serve's handler exists; the later imports find the modules loaded
and change nothing. Their logging is the same as before, only earlier.

vLLM sets UCX_RCACHE_MAX_UNRELEASED=1024 before it imports NIXL (a UCX memory leak), unless it is set, and only
warns if NIXL is already imported; so the hook sets it as vLLM would, first.
"""

from __future__ import annotations

import importlib.util
import os

# vllm/distributed/nixl_utils.py, `_maybe_set_ucx_rcache_limit`: the variable and the value vLLM sets.
UCX_RCACHE_ENV = "UCX_RCACHE_MAX_UNRELEASED"
UCX_RCACHE_VALUE = "1024"


def import_logging_first() -> None:
    """vLLM's and NIXL's logging, before the replica's Serve logger (see the module's docstring)."""
    # The imports are the hook's whole purpose; at module level they would run wherever ray_pods is imported.
    import vllm.logger  # noqa: F401

    # An image without NIXL (aggregated mode needs none) has no NIXL logging to set up.
    if importlib.util.find_spec("nixl") is not None:
        os.environ.setdefault(UCX_RCACHE_ENV, UCX_RCACHE_VALUE)
        import nixl  # type: ignore[import-untyped]  # noqa: F401
