"""A NIXL engine id of its own for every start of an engine, so that a replacement is never read through a dead one.

Runs in each prefill and decode Serve replica, named by the serve config's
`callback_config` (Ray Serve LLM's documented hook, ray/llm/_internal/common/callbacks/base.py).

Why: Ray 2.58 names an engine `<engine_id>-<node ip>-<side channel port>`
(kv_transfer/nixl.py, NixlConnectorBackend.setup), and the port is a base plus the
replica's rank. A replica that Serve starts again on the same node after its engine died
gets the dead one's name. vLLM 0.26's decode skips the NIXL handshake for a name it already
knows (nixl/base_worker.py, `_remote_agents`), and keeps that name's agent for `engine_ttl`
(3600 s) after its last transfer, so it goes on reading KV through the dead engine's agent:
every transfer fails (vllm-project/vllm#49238). With this hook the name becomes
`<engine_id>-<incarnation>-<node ip>-<port>`: decode meets a name it has never seen and
shakes hands again. The rehearsal's engine-death phase reproduces the failure without it.

Order (ray/llm/_internal/serve/engines/vllm/vllm_engine.py): VLLMEngine.__init__ runs the
backend's setup, which writes the name into the LLMConfig's kv_transfer_config; start()
then runs `on_before_node_init`, and only after it builds vLLM's config from those
engine_kwargs. So the hook sees Ray's name and vLLM sees the hook's.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from ray.llm._internal.common.callbacks.base import CallbackBase

logger = logging.getLogger("ray.serve")

# Ray names the engine "<engine_id>-<host>-<port>"; the product's engine ids are one word
# ("prefill", "decode"), so the incarnation goes after the first dash.
SEPARATOR = "-"


def with_incarnation(engine_id: str, incarnation: str) -> str:
    """`prefill-10.0.1.5-20000` -> `prefill-<incarnation>-10.0.1.5-20000`."""
    prefix, sep, rest = engine_id.partition(SEPARATOR)
    return f"{prefix}{SEPARATOR}{incarnation}{sep}{rest}" if sep else f"{prefix}{SEPARATOR}{incarnation}"


class NixlIncarnation(CallbackBase):  # type: ignore[misc]  # Ray ships no type information
    """Gives this replica's engine a NIXL name no earlier engine had (see the module's docstring)."""

    async def on_before_node_init(self) -> None:
        kv: dict[str, Any] | None = self.llm_config.engine_kwargs.get("kv_transfer_config")
        if not kv or "engine_id" not in kv:
            return
        incarnation = secrets.token_hex(4)
        renamed = {**kv, "engine_id": with_incarnation(str(kv["engine_id"]), incarnation)}
        # Both copies Ray keeps (the LLMConfig's and the engine config's engine_kwargs).
        self.llm_config.update_engine_kwargs(kv_transfer_config=renamed)
        logger.info("NIXL engine id %s (was %s)", renamed["engine_id"], kv["engine_id"])
