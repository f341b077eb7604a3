"""Prefix-aware routing (ray_pods/prefix_routing.py): where it is on, what Serve reads, and where its tree lives."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

import pytest
import yaml

from serve_config.deployments import PREFIX_ROUTER, engine_deployment_name, options_of
from settings import Settings, sizing
from tests.conftest import rayservice_from, require_serve_deps, synth

pytestmark = pytest.mark.private_internals
one_ray = pytest.mark.xdist_group("ray")
# Both sides with a range, as the rehearsal's scaling case and a user who scales set them, and the router on.
SIDES = ("prefill", "decode")
RANGES = {
    "prefix_cache_routing": True,
    "prefill_max_replicas": 2,
    "prefill_target_ongoing_requests": 2,
    "decode_max_replicas": 2,
    "decode_target_ongoing_requests": 8,
}


def _app(template: dict[str, Any]) -> dict[str, Any]:
    (app,) = yaml.safe_load(rayservice_from(template)["spec"]["serveConfigV2"])["applications"]
    found: dict[str, Any] = app
    return found


def _router(app: dict[str, Any], side: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = options_of(app, engine_deployment_name(Settings(), side)).get(
        "request_router_config"
    )
    return found


def test_each_side_that_can_run_two_replicas_gets_the_router_and_a_side_of_one_does_not() -> None:
    ranged = _app(synth(**RANGES))
    for side in ("prefill", "decode"):
        router = _router(ranged, side)
        assert router is not None and router["request_router_class"] == PREFIX_ROUTER
    one_each = _app(synth(prefix_cache_routing=True))
    assert _router(one_each, "prefill") is None and _router(one_each, "decode") is None
    # On by default, and off when switched off.
    default_ranges = {k: v for k, v in RANGES.items() if k != "prefix_cache_routing"}
    assert _router(_app(synth(**default_ranges)), "decode") is not None
    switched_off = _app(synth(**{**RANGES, "prefix_cache_routing": False}))
    assert all("request_router_config" not in d for d in switched_off["deployments"])


def test_the_router_options_serve_reads_are_finite_and_evict_within_each_replicas_kv_cache() -> None:
    """Parsed by Serve's own schema, as the controller reads the config: Ray's defaults (an infinite imbalance
    threshold, no eviction) must not come back."""
    require_serve_deps()
    from ray.serve.config import RequestRouterConfig  # imports ray: make test-fast runs without it
    from ray.serve.schema import ServeDeploySchema  # imports ray

    parsed = ServeDeploySchema.parse_obj({"applications": [_app(synth(**RANGES))]})
    (app,) = parsed.applications
    found = {d.name: d.request_router_config for d in app.deployments if d.name.startswith(("Prefill:", "Decode:"))}
    assert len(found) == 2
    settings = Settings(**RANGES)  # type: ignore[arg-type]
    assert settings.prefix_cache_routing
    decode_full_length = sizing.kv_cache_tokens(settings, "decode") // settings.max_model_len
    for side, imbalance in (("prefill", 1.0), ("decode", float(decode_full_length))):
        kwargs = RequestRouterConfig(**found[engine_deployment_name(settings, side)]).request_router_kwargs
        assert kwargs["imbalanced_threshold"] == imbalance and math.isfinite(kwargs["imbalanced_threshold"])
        assert kwargs["do_eviction"] is True
        chars = min(sizing.kv_cache_tokens(settings, side) * sizing.CHARS_PER_TOKEN, sizing.prefix_tree_max_chars())
        assert kwargs["eviction_threshold_chars"] == chars > kwargs["eviction_target_chars"]


def test_serve_imports_the_products_router_from_the_config() -> None:
    require_serve_deps()
    from ray.serve.config import RequestRouterConfig  # imports ray: make test-fast runs without it

    from ray_pods.prefix_routing import PrefixAffinityRouter  # imports ray

    router = _router(_app(synth(**RANGES)), "prefill")
    assert router is not None
    config = RequestRouterConfig(**router)
    assert config.get_serialized_request_router_cls()
    assert config.get_request_router_class() is PrefixAffinityRouter


@one_ray
def test_the_tree_actor_outlives_the_replica_that_created_it_where_rays_own_dies_with_it(local_ray: None) -> None:
    """A decode replica routes to prefill from inside its placement group, child tasks captured, and so creates
    prefill's tree actor. When that replica goes (a scale-down, an upgrade) Serve removes its placement group: Ray's
    own options leave the tree in it, and it dies, and every other caller's routing calls it on; the product's
    keep it out, and it stays."""
    require_serve_deps()
    import ray  # imports ray: make test-fast runs without it
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTreeActor  # imports ray
    from ray.util.placement_group import placement_group, remove_placement_group  # imports ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # imports ray

    from ray_pods.prefix_routing import TREE_ACTOR_NAME, head_node_id, tree_actor_options  # imports ray

    @ray.remote(num_cpus=1)
    class Replica:
        def route(self, options: dict[str, Any]) -> None:
            tree = PrefixTreeActor.options(**options).remote()
            ray.get(tree.get_smallest_tenants.remote(), timeout=30)

    def alive(namespace: str) -> bool:
        try:
            tree = ray.get_actor(TREE_ACTOR_NAME, namespace=namespace)
            ray.get(tree.get_smallest_tenants.remote(), timeout=30)
        except (ValueError, ray.exceptions.RayActorError):
            return False
        return True

    rays_own = {"name": TREE_ACTOR_NAME, "get_if_exists": True, "lifetime": "detached", "namespace": "serve::t::own"}
    products = tree_actor_options("serve::t::product", head_node_id())
    assert head_node_id() is not None
    group = placement_group([{"CPU": 1}])
    ray.get(group.ready(), timeout=60)
    inside = PlacementGroupSchedulingStrategy(group, placement_group_capture_child_tasks=True)
    replica = Replica.options(scheduling_strategy=inside).remote()  # type: ignore[attr-defined]
    ray.get([replica.route.remote(rays_own), replica.route.remote(products)], timeout=60)
    assert alive("serve::t::own") and alive("serve::t::product")
    remove_placement_group(group)
    try:
        # The group goes asynchronously, and what was in it with it.
        deadline = time.monotonic() + 60
        while alive("serve::t::own") and time.monotonic() < deadline:
            time.sleep(1)
        assert not alive("serve::t::own")
        assert alive("serve::t::product")
    finally:
        for namespace in ("serve::t::own", "serve::t::product"):
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(TREE_ACTOR_NAME, namespace=namespace))


@one_ray
def test_a_replica_chosen_for_no_request_goes_to_the_oldest_pending_one(local_ray: None) -> None:
    """The spin that froze decode's routing on the CPU rehearsal: a spare routing task holds no request and is handed
    a replica. Ray's prefix router gives it to no one, and the task loops without yielding; the product's gives it
    to the oldest pending request, as Serve's own routers do."""
    require_serve_deps()
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (  # imports ray
        PrefixCacheAffinityRouter,
    )
    from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata  # imports ray
    from ray.serve._private.request_router.common import PendingRequest  # imports ray

    from ray_pods.prefix_routing import PrefixAffinityRouter  # imports ray

    async def handed(router_class: type) -> list[str | None]:
        router = router_class(
            deployment_id=DeploymentID(name="Prefill", app_name="llm"), handle_source=DeploymentHandleSource.REPLICA
        )
        pending = [
            PendingRequest(
                args=[], kwargs={}, metadata=RequestMetadata(request_id=f"r{i}", internal_request_id=f"i{i}")
            )
            for i in range(2)
        ]
        for request in pending:
            router._pending_requests_to_fulfill.append(request)
            router._add_pending_request_to_indices(request)
        router._fulfill_next_pending_request("replica B", None)
        # A request's own choice still goes to that request, not to the oldest.
        router._fulfill_next_pending_request("replica A", pending[1].metadata)
        return [request.future.result() if request.future.done() else None for request in pending]

    assert asyncio.run(handed(PrefixAffinityRouter)) == ["replica B", "replica A"]
    assert asyncio.run(handed(PrefixCacheAffinityRouter)) == [None, "replica A"]


@one_ray
def test_a_prompt_of_token_ids_goes_by_power_of_two_choices_and_stays_out_of_the_tree(local_ray: None) -> None:
    """The rehearsal's power-of-two run sends its prompts as token ids (rehearsal/prefix_affinity.py): the router has
    no text to match for them, so Ray's choose_replicas returns its power-of-two choice (an empty prefix choice), and
    nothing goes into the tree; a text prompt is matched and put in it. Ray's own router divides by the empty text."""
    require_serve_deps()
    import ray  # imports ray: make test-fast runs without it
    from ray.llm._internal.serve.core.configs.openai_api_models import CompletionRequest  # imports ray
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (  # imports ray
        PrefixCacheAffinityRouter,
    )
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTreeActor  # imports ray
    from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID, RequestMetadata  # ray
    from ray.serve._private.request_router.common import PendingRequest  # imports ray

    from ray_pods.prefix_routing import PrefixAffinityRouter  # imports ray

    deployment = DeploymentID(name="Prefill", app_name="llm")
    replica = ReplicaID("r1", deployment)
    tree = PrefixTreeActor.remote()
    ray.get(tree.add_tenants.remote([replica.to_full_id_str()], time.time()), timeout=30)
    text = "A shared system prompt."

    def pending(prompt: str | list[int]) -> Any:
        metadata = RequestMetadata(request_id="r", internal_request_id="i")
        return PendingRequest(args=[CompletionRequest(model="m", prompt=prompt)], kwargs={}, metadata=metadata)

    async def route(router_class: type, prompt: str | list[int], match: bool = True) -> Any:
        router = router_class(deployment_id=deployment, handle_source=DeploymentHandleSource.REPLICA)
        router.initialize_state(tree_actor=tree, imbalanced_threshold=1)
        request = pending(prompt)
        chosen = await router._prefix_match_best_replicas(request, []) if match else None
        router.on_request_routed(request, replica, None)
        return chosen

    def tree_chars() -> int:
        return int(ray.get(tree.getattr.remote("tenant_to_char_count"), timeout=30)[replica.to_full_id_str()])

    assert asyncio.run(route(PrefixAffinityRouter, [11, 12, 13])) == [[]]
    assert tree_chars() == 0
    with pytest.raises(ZeroDivisionError):
        asyncio.run(route(PrefixCacheAffinityRouter, [11, 12, 13]))
    # Matching a text needs the replica the tree names in the router's set: here only its insert is read.
    asyncio.run(route(PrefixAffinityRouter, text, match=False))
    assert tree_chars() == len(text)


def _stand_in_replicas(deployment: Any, names: list[str]) -> tuple[list[Any], list[Any]]:
    """Serve's own RunningReplica for each name, over a named actor standing in for the replica (the router reads
    only its handle, its id and its queue length: none queued)."""
    import ray  # imports ray: make test-fast runs without it
    from ray.serve._private.common import ReplicaID, RunningReplicaInfo  # imports ray
    from ray.serve._private.constants import SERVE_NAMESPACE  # imports ray
    from ray.serve._private.request_router.replica_wrapper import RunningReplica  # imports ray

    @ray.remote(num_cpus=0)
    class StandIn:
        def ready(self) -> bool:
            return True

        def get_num_ongoing_requests(self) -> int:
            return 0

    actors = [StandIn.options(name=f"t-{name}", namespace=SERVE_NAMESPACE).remote() for name in names]  # type: ignore[attr-defined]
    ray.get([actor.ready.remote() for actor in actors], timeout=60)
    infos = [
        RunningReplicaInfo(
            replica_id=ReplicaID(name, deployment),
            node_id=None,
            node_ip=None,
            availability_zone=None,
            actor_name=f"t-{name}",
            max_ongoing_requests=8,
        )
        for name in names
    ]
    return [RunningReplica(info) for info in infos], actors


def _chat(text: str) -> Any:
    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest  # imports ray
    from ray.serve._private.common import RequestMetadata  # imports ray
    from ray.serve._private.request_router.common import PendingRequest  # imports ray

    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": text}])
    return PendingRequest(args=[request], kwargs={}, metadata=RequestMetadata(request_id="r", internal_request_id="i"))


def _product_router(deployment: Any, tree: Any, replicas: list[Any]) -> Any:
    """The product's router over `replicas`, their queues known and equal, as Serve makes and feeds it."""
    from ray.serve._private.common import DeploymentHandleSource  # imports ray

    from ray_pods.prefix_routing import PrefixAffinityRouter  # imports ray

    router = PrefixAffinityRouter(deployment_id=deployment, handle_source=DeploymentHandleSource.REPLICA)
    router.initialize_state(
        tree_actor=tree, imbalanced_threshold=4.0, do_eviction=True, eviction_threshold_chars=10**6,
        eviction_target_chars=9 * 10**5,
    )  # fmt: skip
    router.update_replicas(replicas)
    for replica in replicas:
        router.on_new_queue_len_info(replica.replica_id, 0)
    return router


def _within(seconds: float, work: Any) -> tuple[float, Any]:
    """`work()`'s result and how long it took, failing if it has not returned within `seconds`: a router that blocks
    on the tree blocks the thread that calls it, which no asyncio timeout can interrupt."""
    import threading

    found: list[Any] = []
    started = time.monotonic()
    thread = threading.Thread(target=lambda: found.append(work()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert found, f"routing still waiting for the tree after {seconds:.0f} s"
    return time.monotonic() - started, found[0]


@one_ray
def test_routing_goes_by_load_within_a_bound_while_the_tree_cannot_answer(local_ray: None) -> None:
    """The tree away, as while the head it ran on is lost and its restart waits for the GCS: here a tree that
    cannot be placed, whose calls wait as Ray's do then. Ray's router waits in `ray.get` as long as that lasts, on
    the event loop every router of the process shares; the product's waits at most TREE_CALL_TIMEOUT_S for the first
    request, routes the next ones by load at once, and sends the tree's bookkeeping without waiting. A tree dead for
    good (its calls raise) is routed around too."""
    require_serve_deps()
    import ray  # imports ray: make test-fast runs without it
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTreeActor  # imports ray
    from ray.serve._private.common import DeploymentID  # imports ray

    from ray_pods.prefix_routing import TREE_CALL_TIMEOUT_S  # imports ray

    deployment = DeploymentID(name="Decode", app_name="away")
    replicas, actors = _stand_in_replicas(deployment, ["a1", "a2"])
    unplaceable = PrefixTreeActor.options(resources={"no-such-node": 1}).remote()
    dead = PrefixTreeActor.remote()
    ray.get(dead.get_smallest_tenants.remote(), timeout=30)
    ray.kill(dead, no_restart=True)
    try:
        for tree in (unplaceable, dead):

            async def route(tree: Any = tree) -> tuple[list[float], list[Any]]:
                took, chosen = [], []
                router = _product_router(deployment, tree, replicas)
                for text in ("A first prompt.", "A second prompt.", "A third prompt."):
                    started = time.monotonic()
                    chosen.append(await router._prefix_match_best_replicas(_chat(text), replicas))
                    router.on_request_routed(_chat(text), replicas[0].replica_id, None)
                    took.append(time.monotonic() - started)
                router.on_replica_actor_died(replicas[1].replica_id)
                return took, chosen

            _, (took, chosen) = _within(TREE_CALL_TIMEOUT_S * 3 + 10, lambda route=route: asyncio.run(route()))
            # An empty choice: choose_replicas returns its power-of-two choice.
            assert chosen == [[[]]] * 3
            assert took[0] < TREE_CALL_TIMEOUT_S + 1.0
            assert max(took[1:]) < 0.1, took
    finally:
        ray.kill(unplaceable)
        for actor in actors:
            ray.kill(actor)


async def _shares(router: Any, replicas: list[Any], prompts: list[str]) -> dict[str, int]:
    """Each replica's count of `prompts`, each routed as Serve routes it: the first of the router's choice, or the
    first replica where it makes none (power of two choices, here without randomness), then reported routed."""
    counts = {replica.replica_id.unique_id: 0 for replica in replicas}
    for text in prompts:
        (chosen,) = await router._prefix_match_best_replicas(_chat(text), replicas)
        replica = (chosen or replicas)[0]
        counts[replica.replica_id.unique_id] += 1
        router.on_request_routed(_chat(text), replica.replica_id, None)
        await asyncio.sleep(0.05)
    return counts


@one_ray
def test_a_restarted_tree_gets_every_replica_and_its_eviction_back(local_ray: None) -> None:
    """The tree restarts empty (its node lost; it is the product's options that restart it at all). Ray re-adds only
    replicas a router newly sees, so after a scale-up the new replica is the tree's only tenant: every prompt that
    matches nothing goes to it, the others' prompts are dropped, and nothing evicts. The product's routers re-register
    their replicas and the eviction loop: after the scale-up the tree knows all three, and each gets a share."""
    require_serve_deps()
    import ray  # imports ray: make test-fast runs without it
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTreeActor  # imports ray
    from ray.serve._private.common import DeploymentID  # imports ray

    from ray_pods.prefix_routing import TREE_RESYNC_S, head_node_id, tree_actor_options  # imports ray

    deployment = DeploymentID(name="Prefill", app_name="restart")
    replicas, actors = _stand_in_replicas(deployment, ["b1", "b2", "b3"])
    names = {r.replica_id.to_full_id_str(): r.replica_id.unique_id for r in replicas}
    tree = PrefixTreeActor.options(**tree_actor_options("serve::t::restart", head_node_id())).remote()

    async def state() -> tuple[dict[str, int], bool]:
        counts = await asyncio.wait_for(tree.getattr.remote("tenant_to_char_count"), 60)
        evicting = await asyncio.wait_for(tree.__ray_call__.remote(lambda t: t._eviction_thread is not None), 60)
        return {names[k]: v for k, v in counts.items()}, evicting

    async def scenario() -> tuple[dict[str, int], bool, dict[str, int]]:
        router = _product_router(deployment, tree, replicas[:2])
        await _shares(router, replicas[:2], [f"before {i}: " + "x" * i for i in range(4)])
        counts, evicting = await state()
        assert set(counts) == {"b1", "b2"} and evicting
        ray.kill(tree, no_restart=False)
        # Serve keeps routing while the tree restarts, and past a resync.
        deadline = time.monotonic() + TREE_RESYNC_S + 30
        while time.monotonic() < deadline:
            await _shares(router, replicas[:2], ["during the restart"])
            with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
                if set((await state())[0]) == {"b1", "b2"}:
                    break
            await asyncio.sleep(0.5)
        router.update_replicas(replicas)
        router.on_new_queue_len_info(replicas[2].replica_id, 0)
        # Prompts that match nothing in the tree: each goes to the tree's smallest replica.
        shares = await _shares(router, replicas, [f"{i} " + chr(0x4E00 + i) * 40 for i in range(12)])
        return *(await state()), shares

    try:
        counts, evicting, shares = asyncio.run(scenario())
        assert set(counts) == {"b1", "b2", "b3"} and all(counts.values()), counts
        assert evicting
        assert min(shares.values()) >= 3, shares
    finally:
        ray.kill(tree)
        for actor in actors:
            ray.kill(actor)


@one_ray
def test_prefill_and_decode_each_get_a_tree_of_their_own(local_ray: None) -> None:
    """The namespaces the product's router gives the synthesized app's two engine deployments, and the trees made
    with them: a prompt one side's router puts in its tree is not in the other's (a shared tree would send a decode
    request to the replica id of a prefill replica), while two routers of one side share theirs."""
    require_serve_deps()
    import ray  # imports ray: make test-fast runs without it
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTreeActor  # imports ray
    from ray.serve._private.common import DeploymentID  # imports ray

    from ray_pods.prefix_routing import tree_actor_options, tree_namespace  # imports ray

    (app,) = yaml.safe_load(rayservice_from(synth(**RANGES))["spec"]["serveConfigV2"])["applications"]
    settings = Settings(**RANGES)  # type: ignore[arg-type]
    ids = {
        side: DeploymentID(name=engine_deployment_name(settings, side), app_name=app["name"])
        for side in ("prefill", "decode")
    }
    trees = {
        side: PrefixTreeActor.options(**tree_actor_options(tree_namespace(ids[side]), None)).remote() for side in ids
    }
    again = PrefixTreeActor.options(**tree_actor_options(tree_namespace(ids["decode"]), None)).remote()
    try:
        ray.get(trees["prefill"].add_tenants.remote(["p"], time.time()), timeout=60)
        ray.get(trees["decode"].add_tenants.remote(["d"], time.time()), timeout=60)
        tenants = {
            side: set(ray.get(tree.getattr.remote("tenant_to_char_count"), timeout=60)) for side, tree in trees.items()
        }
        assert tenants == {"prefill": {"p"}, "decode": {"d"}}
        assert set(ray.get(again.getattr.remote("tenant_to_char_count"), timeout=60)) == {"d"}
    finally:
        for tree in trees.values():
            ray.kill(tree)


@one_ray
def test_the_tree_holds_a_long_prompts_beginning_only(local_ray: None) -> None:
    """A prompt longer than MAX_TREE_TEXT_CHARS goes into the tree cut to that length, and is matched by it."""
    require_serve_deps()
    import ray  # imports ray: make test-fast runs without it
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTreeActor  # imports ray
    from ray.serve._private.common import DeploymentID  # imports ray

    from ray_pods.prefix_routing import MAX_TREE_TEXT_CHARS  # imports ray

    deployment = DeploymentID(name="Decode", app_name="long")
    replicas, actors = _stand_in_replicas(deployment, ["c1"])
    tree = PrefixTreeActor.remote()
    # Started before it is routed with: a tree still starting is a tree away.
    ray.get(tree.get_smallest_tenants.remote(), timeout=60)
    long = "x" * (MAX_TREE_TEXT_CHARS * 3)

    async def route() -> Any:
        router = _product_router(deployment, tree, replicas)
        router.on_request_routed(_chat(long), replicas[0].replica_id, None)
        return await router._prefix_match_best_replicas(_chat(long), replicas)

    try:
        chosen = asyncio.run(route())
        counts = ray.get(tree.getattr.remote("tenant_to_char_count"), timeout=60)
        assert counts == {replicas[0].replica_id.to_full_id_str(): MAX_TREE_TEXT_CHARS}
        assert chosen == [replicas]
    finally:
        ray.kill(tree)
        for actor in actors:
            ray.kill(actor)
