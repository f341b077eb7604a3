"""Bigger instances: every GPU and every EFA card in use, tensor parallelism per side.

Three configurations are synthesized: g6.8xlarge on today's defaults, g6e.12xlarge with TP 4
and a 70B model (it needs the four L40S), p5.48xlarge with a 70B model and a TP pair that
differs (prefill 8, decode 4: two decode pods per node). For each: the launch template's
interfaces match the card table, the pods' requests match the node, the serve config passes
Ray's builder, vLLM's EngineArgs and KVTransferConfig and the strict KubeRay CRD, and the
placement proof places every worker and leaves no GPU or EFA device idle.

Mismatched TP cannot run on this CPU (vLLM's CPU build runs no tensor-parallel NIXL pair
here, and the rehearsal's engines have one process each): the TP rules are checked against
vLLM 0.26's own code instead, TransferTopology.tp_ratio and the handshake's validation.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from cdk_constructs.gpu_nodes import network_interface_layout
from serve_config import DECODE, EFA_RESOURCE, GPU_RESOURCE, PREFILL, SIDES
from serve_config.application import KV_LAYOUT_ENV, serve_config
from serve_config.deployments import options_of
from serve_config.pod_templates import worker_resources
from settings import Settings, SettingsError, settings_from_cli, sizing
from settings.catalog import INSTANCE_TYPES, MODELS
from settings.estimates import cost_summary, hourly_cost
from settings.model import TENSOR_PARALLEL_SIZES
from settings.rules import validate
from tests.conftest import rayservice_from, require_serve_deps, resources, shared_file, synth
from tests.support import placement
from tests.support.cluster import DEVICE_PLUGIN_DAEMONSETS, placed, workloads
from tests.support.kuberay_schema import validation_errors
from tests.support.preflight_account import (
    RESERVATION,
    ROLE,
    TYPES,
    account,
    check,
    instance_type,
    preflight,
    reservation,
    secret,
)
from tests.support.reachability_cluster import cluster, ray_pods, refused, required_pairs
from tools.bench import describe_serve_config
from tools.checks import nixl_log_findings
from tools.plan import main
from tools.verify_judgement import placement_check

pytestmark = [pytest.mark.xdist_group("placement"), pytest.mark.private_internals]

LLAMA_70B = "meta-llama/Llama-3.3-70B-Instruct"
TOKEN = {"hf_token_secret_name": "prod/hf-token"}
CONFIGS: dict[str, dict[str, Any]] = {
    "g6.8xlarge-defaults": {},
    "g6e.12xlarge-tp4": {
        "gpu_instance_type": "g6e.12xlarge",
        "model_id": LLAMA_70B,
        "prefill_tensor_parallel_size": 4,
        "decode_tensor_parallel_size": 4,
        **TOKEN,
    },
    "p5.48xlarge-70b": {
        "gpu_instance_type": "p5.48xlarge",
        "model_id": LLAMA_70B,
        "prefill_tensor_parallel_size": 8,
        "decode_tensor_parallel_size": 4,
        "decode_replicas": 2,
        **TOKEN,
    },
}
IDS = list(CONFIGS)
CRD = "kuberay-v1.7.0/ray.io_rayservices.yaml"


def _settings(name: str) -> Settings:
    return validate(Settings(**CONFIGS[name]))


def _gpu_launch_template(template: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any]
    (data,) = [
        r["Properties"]["LaunchTemplateData"]
        for r in resources(template, "AWS::EC2::LaunchTemplate").values()
        if "NetworkInterfaces" in r["Properties"]["LaunchTemplateData"]
    ]
    return data


def _gpu_nodegroup(template: dict[str, Any]) -> dict[str, Any]:
    group: dict[str, Any]
    (group,) = [
        r["Properties"]
        for r in resources(template, "AWS::EKS::Nodegroup").values()
        if r["Properties"]["AmiType"] == "AL2023_x86_64_NVIDIA"
    ]
    return group


def _groups(rayservice: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The GPU worker groups (the ingress group is on the system nodes)."""
    groups = rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return {g["groupName"]: g for g in groups if g["groupName"] in (PREFILL, DECODE)}


def _args(rayservice: dict[str, Any]) -> dict[str, Any]:
    (app,) = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
    args: dict[str, Any] = app["args"]
    return args


# --- The card table and the launch template -------------------------------------------------------
def test_the_card_table_has_the_documented_counts() -> None:
    """EC2 User Guide (network cards; multiple network cards): p5.48xlarge 32, p4d.24xlarge and g6e.48xlarge 4,
    the G types with EFA 1; GPUDirect RDMA on p4d and p5 only (aws/aws-ofi-nccl#547)."""
    cards = {name: (spec.network_cards, spec.efa_interfaces) for name, spec in INSTANCE_TYPES.items() if spec.gpus}
    assert cards["p5.48xlarge"] == (32, 32)
    assert cards["p4d.24xlarge"] == (4, 4)
    assert cards["g6e.48xlarge"] == (4, 4)
    for name in ("g6.8xlarge", "g6.12xlarge", "g6e.8xlarge", "g6e.12xlarge", "g5.8xlarge", "g5.12xlarge"):
        assert cards[name] == (1, 1), name
    assert {n for n, s in INSTANCE_TYPES.items() if s.gpudirect_rdma} == {"p4d.24xlarge", "p5.48xlarge"}
    for spec in INSTANCE_TYPES.values():
        assert spec.efa_interfaces <= spec.network_cards


def test_the_multi_card_layout_is_the_ec2_user_guides() -> None:
    assert network_interface_layout("g6.8xlarge") == [(0, 0, "efa")]
    assert network_interface_layout("p5.48xlarge") == [
        (0, 0, "interface"),
        (0, 1, "efa-only"),
        *((card, 0, "efa-only") for card in range(1, 32)),
    ]
    # efa-only unconfirmed on p4d: an EFA-with-ENA interface on every card.
    assert network_interface_layout("p4d.24xlarge") == [(card, 0, "efa") for card in range(4)]


@pytest.mark.parametrize("name", IDS)
def test_launch_template_interfaces_match_the_card_table(name: str) -> None:
    settings = _settings(name)
    spec = settings.gpu_instance
    template = synth(**CONFIGS[name])
    interfaces = _gpu_launch_template(template)["NetworkInterfaces"]
    efa = [i for i in interfaces if i["InterfaceType"] in ("efa", "efa-only")]
    # One EFA device on every card, none twice, and the primary interface carries IP traffic.
    assert sorted(i["NetworkCardIndex"] for i in efa) == list(range(spec.network_cards))
    assert len(efa) == spec.efa_interfaces
    (primary,) = [i for i in interfaces if (i["NetworkCardIndex"], i["DeviceIndex"]) == (0, 0)]
    assert primary["InterfaceType"] in ("efa", "interface")
    assert all(len(i["Groups"]) == 2 and i["DeleteOnTermination"] for i in interfaces)
    assert "SubnetId" not in str(interfaces)
    group = _gpu_nodegroup(template)
    assert group["InstanceTypes"] == [settings.gpu_instance_type]
    assert group["ScalingConfig"]["DesiredSize"] == settings.gpu_nodes
    if name == "g6.8xlarge-defaults":
        # Today's interface, unchanged.
        assert interfaces == [
            {
                "DeleteOnTermination": True,
                "DeviceIndex": 0,
                "Groups": interfaces[0]["Groups"],
                "InterfaceType": "efa",
                "NetworkCardIndex": 0,
            }
        ]


# --- The pods and the nodes -------------------------------------------------------------------------
EXPECTED_PODS = {
    # side: (pods, GPUs per pod, EFA per pod, pods per node)
    "g6.8xlarge-defaults": {PREFILL: (1, 1, 1, 1), DECODE: (1, 1, 1, 1)},
    "g6e.12xlarge-tp4": {PREFILL: (1, 4, 1, 1), DECODE: (1, 4, 1, 1)},
    "p5.48xlarge-70b": {PREFILL: (1, 8, 32, 1), DECODE: (2, 4, 16, 2)},
}


@pytest.mark.parametrize("name", IDS)
def test_pod_requests_match_the_node(name: str) -> None:
    settings = _settings(name)
    spec = settings.gpu_instance
    rayservice = rayservice_from(synth(**CONFIGS[name]))
    nodes = 0
    for side, group in _groups(rayservice).items():
        pods, gpus, efa, per_node = EXPECTED_PODS[name][side]
        container = group["template"]["spec"]["containers"][0]
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        assert requests == limits
        assert (group["replicas"], int(requests[GPU_RESOURCE]), int(requests[EFA_RESOURCE])) == (pods, gpus, efa)
        # The pods of one node hold all its GPUs and EFA devices, and fit its CPU and memory.
        assert per_node * gpus == spec.gpus and per_node * efa == spec.efa_interfaces
        assert per_node * int(requests["cpu"]) <= spec.vcpus - 4
        assert per_node * int(requests["memory"].removesuffix("Gi")) <= spec.memory_gib * 0.75
        nodes += pods // per_node
    assert nodes == settings.gpu_nodes == _gpu_nodegroup(synth(**CONFIGS[name]))["ScalingConfig"]["MinSize"]


@pytest.mark.parametrize("name", IDS)
def test_gpudirect_types_keep_kv_in_gpu_memory_and_g_types_stage_in_host_memory(name: str) -> None:
    settings = _settings(name)
    rayservice = rayservice_from(synth(**CONFIGS[name]))
    rdma = settings.gpu_instance.gpudirect_rdma
    for side in SIDES:
        kv = _args(rayservice)[f"{side}_config"]["engine_kwargs"]["kv_transfer_config"]
        assert kv["kv_buffer_device"] == ("cuda" if rdma else "cpu")
        env = {e["name"]: e.get("value") for e in _groups(rayservice)[side]["template"]["spec"]["containers"][0]["env"]}
        assert ("FI_EFA_USE_DEVICE_RDMA" in env) == rdma
        caps = _groups(rayservice)[side]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]
        assert "IPC_LOCK" in caps["add"]


# --- The serve config under Ray's, vLLM's and KubeRay's own validators --------------------------------
@pytest.mark.parametrize("name", IDS)
def test_engine_tensor_parallel_and_bundles_per_tp_group(name: str) -> None:
    settings = _settings(name)
    args = _args(rayservice_from(synth(**CONFIGS[name])))
    for side in SIDES:
        config = args[f"{side}_config"]
        tp = settings.tensor_parallel_size(side)
        assert config["engine_kwargs"]["tensor_parallel_size"] == tp
        bundles = config["placement_group_config"]["bundles"]
        assert len(bundles) == tp and all(b["GPU"] == 1 for b in bundles)
        assert [b.get(side) for b in bundles] == [1] + [None] * (tp - 1)
        assert config["placement_group_config"]["strategy"] == "STRICT_PACK"
        layout = config.get("runtime_env", {}).get("env_vars", {}).get(KV_LAYOUT_ENV)
        mismatch = settings.prefill_tensor_parallel_size != settings.decode_tensor_parallel_size
        assert layout == ("HND" if mismatch else None)


@pytest.mark.serve
@pytest.mark.parametrize("name", IDS)
def test_vllm_accepts_each_sides_engine_arguments(name: str) -> None:
    require_serve_deps()
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    args = _args(rayservice_from(synth(**CONFIGS[name])))
    for side in SIDES:
        config = args[f"{side}_config"]
        engine = dict(config["engine_kwargs"])
        kv = KVTransferConfig(**engine.pop("kv_transfer_config"))
        assert kv.is_kv_transfer_instance
        parsed = AsyncEngineArgs(model=config["model_loading_config"]["model_source"], kv_transfer_config=kv, **engine)
        assert parsed.tensor_parallel_size == _settings(name).tensor_parallel_size(side)


@pytest.mark.serve
@pytest.mark.parametrize("name", IDS)
def test_rays_builder_places_each_replica_on_its_tp_groups_bundles(name: str, local_ray: None) -> None:
    from ray.serve._private.build_app import build_app
    from ray.serve.llm import LLMConfig, build_pd_openai_app

    settings = _settings(name)
    rayservice = rayservice_from(synth(**CONFIGS[name]))
    args = _args(rayservice)
    for side in SIDES:
        LLMConfig.model_validate(args[f"{side}_config"])
    built = build_app(build_pd_openai_app(copy.deepcopy(args)), name="llm")
    deployments = {d.name: d for d in built.deployments}
    for side, prefix in ((PREFILL, "Prefill:"), (DECODE, "Decode:")):
        (found,) = [d for n, d in deployments.items() if n.startswith(prefix)]
        bundles = found._replica_config.placement_group_bundles
        assert len(bundles) == settings.tensor_parallel_size(side)
        assert sum(b.get("GPU", 0) for b in bundles) == settings.tensor_parallel_size(side)
        assert bundles[0].get(side) == 1
        assert found._replica_config.placement_group_strategy == "STRICT_PACK"
        # Serve applies the application's `deployments` list to the deployment the builder named.
        (app,) = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
        assert options_of(app, found.name)["num_replicas"] == settings.side_replicas(side)


@pytest.mark.parametrize("name", IDS)
def test_the_rayservice_passes_the_strict_crd(name: str) -> None:
    assert validation_errors(rayservice_from(synth(**CONFIGS[name])), shared_file(CRD)) == []


# --- The placement proof: every worker placed, no GPU or EFA device idle --------------------------------
@pytest.mark.parametrize("name", IDS)
def test_every_worker_lands_and_no_gpu_or_efa_device_is_idle(name: str) -> None:
    settings = _settings(name)
    result = placed(**CONFIGS[name])
    assert result.failures == []
    gpu_nodes = [n for n in result.nodes if n.labels.get("role") == "gpu-worker"]
    assert len(gpu_nodes) == settings.gpu_nodes
    for node in gpu_nodes:
        for resource in (GPU_RESOURCE, EFA_RESOURCE):
            assert node.used.get(resource, 0) == node.allocatable[resource], f"{node.name}: {resource} idle"
    for side in SIDES:
        assert len(result.placed[f"{settings.service_name}/{side}"]) == settings.side_replicas(side)


def test_the_placement_proof_catches_an_idle_gpu() -> None:
    """The same proof on a worker that asks for half the GPUs it should: half of each node sits idle."""
    template = synth(**CONFIGS["g6e.12xlarge-tp4"])
    rayservice = rayservice_from(template)
    for group in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        for kind in ("requests", "limits"):
            group["template"]["spec"]["containers"][0]["resources"][kind][GPU_RESOURCE] = "2"
    nodes = placement.nodes_from_template(template, "1.36")

    found = [w for w in workloads(template, "1.36") if w.source != "RayService"] + placement.ray_workloads(rayservice)
    result = placement.place(nodes, found, DEVICE_PLUGIN_DAEMONSETS)
    gpu_nodes = [n for n in result.nodes if n.labels.get("role") == "gpu-worker"]
    assert any(n.used.get(GPU_RESOURCE, 0) < n.allocatable[GPU_RESOURCE] for n in gpu_nodes)


# --- Refusals, each in one line -------------------------------------------------------------------------
def _refusal(**overrides: Any) -> SettingsError:
    with pytest.raises(SettingsError) as caught:
        validate(Settings(**overrides))
    assert "\n" not in str(caught.value)
    return caught.value


def test_an_idle_gpu_configuration_is_refused_saying_what_fits() -> None:
    err = _refusal(**{**CONFIGS["p5.48xlarge-70b"], "decode_replicas": 1})
    assert err.key == "decode_replicas"
    assert "leave 4 of p5.48xlarge's 8 GPUs idle" in str(err)
    assert "decode_replicas=2" in str(err) and "decode_tensor_parallel_size=8" in str(err)


def test_a_pod_without_a_whole_efa_device_is_refused() -> None:
    err = _refusal(**{**CONFIGS["g6e.12xlarge-tp4"], "prefill_tensor_parallel_size": 2, "prefill_replicas": 2})
    assert err.key == "prefill_tensor_parallel_size" and "use one of [4]" in str(err)


def test_a_tp_pair_vllm_does_not_support_is_refused() -> None:
    # Qwen2.5-7B has 4 KV heads: a prefill TP of 8 replicates them, which decode at TP 4 refuses.
    err = _refusal(
        gpu_instance_type="p5.48xlarge",
        model_id="Qwen/Qwen2.5-7B-Instruct",
        prefill_tensor_parallel_size=8,
        decode_tensor_parallel_size=4,
        decode_replicas=2,
    )
    assert err.key == "prefill_tensor_parallel_size" and "at most 4" in str(err)


def test_a_gated_70b_model_needs_the_token_secret() -> None:
    err = _refusal(**{k: v for k, v in CONFIGS["p5.48xlarge-70b"].items() if k != "hf_token_secret_name"})
    assert err.key == "model_id" and "hf_token_secret_name" in str(err)


def test_the_70b_row_is_its_config_json() -> None:
    model = MODELS[LLAMA_70B]
    shape = (model.layers, model.kv_heads, model.head_dim, model.hidden_size, model.intermediate_size)
    assert shape == (80, 8, 128, 8192, 28672)
    assert (model.vocab_size, model.max_context_tokens, model.dtype_bytes, model.needs_token) == (
        128256,
        131072,
        2,
        True,
    )


# --- The TP rules against vLLM 0.26's own code -------------------------------------------------------------
def _vllm_accepts(prefill_tp: int, decode_tp: int, kv_heads: int, layout: str) -> bool:
    """Decode's handshake with a prefill worker, through vLLM's TransferTopology and
    NixlBaseConnectorWorker._validate_remote_agent_handshake (decode is the local side)."""
    require_serve_deps()
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.utils import EngineTransferInfo, TransferTopology
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import NixlAgentMetadata
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    topology = TransferTopology(
        tp_rank=0,
        tp_size=decode_tp,
        block_size=16,
        engine_id="decode",
        is_mla=False,
        is_mamba=False,
        total_num_kv_heads=kv_heads,
        attn_backends=[CPUAttentionBackend],
    )
    local_heads = max(1, kv_heads // decode_tp)
    remote_heads = max(1, kv_heads // prefill_tp)
    local_len = 16 * local_heads * 2 * 128 * 2
    remote_len = local_len * remote_heads // local_heads
    try:
        topology.register_remote_engine(
            "prefill",
            EngineTransferInfo(
                remote_tp_size=prefill_tp,
                remote_block_len=remote_len,
                remote_block_size=16,
                remote_physical_blocks_per_logical=1,
            ),
        )
        topology.tp_ratio(prefill_tp)
        worker = SimpleNamespace(
            transfer_topo=topology,
            use_mla=False,
            _has_mamba=False,
            _is_hma_required=False,
            kv_cache_layout=layout,
            use_host_buffer=False,
            host_buffer_kv_cache_layout=layout,
            kv_transfer_config=KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both"),
            enable_permute_local_kv=False,
            backend_name="FLASH_ATTN",
            block_len_per_layer=[local_len],
            _is_region_replicated=lambda i: False,
            dst_num_blocks={"prefill": 10},
        )
        meta = NixlAgentMetadata(
            engine_id="prefill",
            agent_metadata=b"",
            kv_caches_base_addr=[0],
            device_id=0,
            num_blocks=10,
            block_lens=[remote_len],
            kv_cache_layout=layout,
            block_size=16,
            ssm_sizes=(0, 0),
            attn_backend_name="FLASH_ATTN",
            physical_blocks_per_logical_kv_block=1,
        )
        NixlBaseConnectorWorker._validate_remote_agent_handshake(worker, meta, prefill_tp)
    except (AssertionError, RuntimeError):
        return False
    return True


def _we_accept(prefill_tp: int, decode_tp: int, model_id: str) -> bool:
    try:
        validate(
            Settings(
                gpu_instance_type="p5.48xlarge",
                model_id=model_id,
                prefill_tensor_parallel_size=prefill_tp,
                decode_tensor_parallel_size=decode_tp,
                prefill_replicas=8 // prefill_tp,
                decode_replicas=8 // decode_tp,
                hf_token_secret_name="prod/hf-token",
            )
        )
    except SettingsError as err:
        # Refused for the pair, never for something else about these settings.
        return not err.key.endswith("tensor_parallel_size") and _raise(err)
    return True


def _raise(err: Exception) -> bool:
    raise err


@pytest.mark.serve
@pytest.mark.parametrize("model_id", ["Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen3-14B"])
def test_our_tp_rules_are_vllms_with_the_layout_we_emit(model_id: str) -> None:
    heads = MODELS[model_id].kv_heads
    for prefill_tp in TENSOR_PARALLEL_SIZES:
        for decode_tp in TENSOR_PARALLEL_SIZES:
            pair = (prefill_tp, decode_tp, heads)
            assert _we_accept(prefill_tp, decode_tp, model_id) == _vllm_accepts(*pair, "HND"), pair


@pytest.mark.serve
def test_without_hnd_vllm_refuses_every_mismatch_that_splits_heads() -> None:
    """Why the serve config pins VLLM_KV_CACHE_LAYOUT=HND on a mismatched pair."""
    assert _vllm_accepts(4, 4, 8, "NHD")
    assert not _vllm_accepts(8, 4, 8, "NHD")
    assert not _vllm_accepts(4, 8, 8, "NHD")
    assert _vllm_accepts(8, 4, 8, "HND") and _vllm_accepts(4, 8, 8, "HND")


# --- Capacity Blocks ----------------------------------------------------------------------------------------
BLOCK = {"gpu_capacity_reservation_id": RESERVATION, "gpu_placement_group": False, "gpu_capacity_block": True}


def test_a_capacity_block_sets_the_capacity_type_and_the_market_type() -> None:
    template = synth(**BLOCK)
    assert _gpu_nodegroup(template)["CapacityType"] == "CAPACITY_BLOCK"
    data = _gpu_launch_template(template)
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    target = data["CapacityReservationSpecification"]["CapacityReservationTarget"]
    assert target["CapacityReservationId"] == RESERVATION
    assert "CapacityType" not in _gpu_nodegroup(synth())
    assert "InstanceMarketOptions" not in _gpu_launch_template(synth())


def test_a_capacity_block_needs_its_reservation() -> None:
    assert _refusal(gpu_capacity_block=True).key == "gpu_capacity_block"


CB_ARGS = [f"cluster_admin_arns={ROLE}", *(f"{k}={v}" for k, v in BLOCK.items())]


@pytest.mark.parametrize(
    ("start", "end", "hours", "expected", "said"),
    [
        (-1, 24 * 10, 24, "PASS", "Capacity Block from"),
        (-1, 5, 24, "WARN", "within capacity_block_end_warning_hours=24"),
        (-1, 5, 4, "PASS", "its end terminates the GPU nodes"),
        (2, 24 * 3, 24, "WARN", "cannot launch before it starts"),
    ],
)
def test_preflight_prints_a_capacity_blocks_window_and_warns_near_its_end(
    start: int, end: int, hours: int, expected: str, said: str
) -> None:
    now = datetime.now(UTC)
    begins, ends = now + timedelta(hours=start), now + timedelta(hours=end)
    found = reservation(
        ReservationType="capacity-block",
        State="active" if start < 0 else "scheduled",
        StartDate=begins,
        EndDate=ends,
        EndDateType="limited",
    )
    line = check(
        preflight(
            account(**{"ec2:DescribeCapacityReservations": found}),
            *CB_ARGS,
            f"capacity_block_end_warning_hours={hours}",
        ),
        "capacity reservation",
    )
    assert line.status == expected and said in line.detail, line
    assert f"{begins:%Y-%m-%d %H:%M} UTC" in line.detail and f"{ends:%Y-%m-%d %H:%M} UTC" in line.detail


def test_preflight_fails_a_capacity_block_setting_on_an_ordinary_reservation() -> None:
    line = check(
        preflight(account(**{"ec2:DescribeCapacityReservations": reservation()}), *CB_ARGS), "capacity reservation"
    )
    assert line.status == "FAIL" and "not a Capacity Block" in line.detail


# --- preflight's card count ----------------------------------------------------------------------------------
def _p5(cards: int, interfaces: int) -> dict[str, Any]:
    found = instance_type("p5.48xlarge", 192, True, 30720)
    found["NetworkInfo"]["MaximumNetworkCards"] = cards
    found["NetworkInfo"]["EfaInfo"]["MaximumEfaInterfaces"] = interfaces
    return found


@pytest.mark.parametrize(("cards", "interfaces", "expected"), [(32, 32, "PASS"), (16, 16, "FAIL"), (32, 1, "FAIL")])
def test_preflight_checks_the_card_count_against_ec2(cards: int, interfaces: int, expected: str) -> None:
    types = {**TYPES, "p5.48xlarge": _p5(cards, interfaces)}

    def described(params: dict[str, Any], _: str) -> dict[str, Any]:
        return {"InstanceTypes": [types[t] for t in params["InstanceTypes"]]}

    changes: dict[str, Any] = {"ec2:DescribeInstanceTypes": described, "secretsmanager:DescribeSecret": secret()}
    answers = account(**changes)
    args = [f"cluster_admin_arns={ROLE}", *(f"{k}={v}" for k, v in CONFIGS["p5.48xlarge-70b"].items())]
    line = check(preflight(answers, *args), "EFA")
    assert line.status == expected, line
    assert "the stack attaches 32 EFA interface(s)" in line.detail
    if expected == "FAIL":
        assert f"EC2 says {interfaces} on {cards}" in line.detail


def test_settings_from_the_cli_take_the_new_keys() -> None:
    loaded = settings_from_cli([f"{k}={v}" for k, v in CONFIGS["p5.48xlarge-70b"].items()])
    assert (loaded.prefill_tensor_parallel_size, loaded.decode_tensor_parallel_size, loaded.gpu_nodes) == (8, 4, 2)


# --- verify on multi-GPU pods ----------------------------------------------------------------------------------
def _pod(name: str, side: str, node: str, efa: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"ray.io/group": side}},
        "spec": {"nodeName": node, "containers": [{"resources": {"limits": {EFA_RESOURCE: efa}}}]},
        "status": {"phase": "Running"},
    }


def _node(efa: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"topology.kubernetes.io/zone": "a"}},
        "status": {"allocatable": {EFA_RESOURCE: efa}},
    }


def test_verify_accepts_p5s_pods_and_refuses_a_pod_short_of_its_cards() -> None:
    settings = _settings("p5.48xlarge-70b")
    efa = {side: int(worker_resources(settings, side)[EFA_RESOURCE]) for side in SIDES}
    per_node = {side: settings.replicas_per_node(side) for side in SIDES}
    assert (efa, per_node) == ({PREFILL: 32, DECODE: 16}, {PREFILL: 1, DECODE: 2})
    groups = {
        PREFILL: [_pod("p0", PREFILL, "n1", "32")],
        DECODE: [_pod("d0", DECODE, "n2", "16"), _pod("d1", DECODE, "n2", "16")],
    }
    nodes = {"n1": _node("32"), "n2": _node("32")}
    assert placement_check(groups, nodes, efa, per_node).ok
    short = {**groups, DECODE: [_pod("d0", DECODE, "n2", "16"), _pod("d1", DECODE, "n2", "1")]}
    assert "d1: no EFA device, or not its 16" in placement_check(short, nodes, efa, per_node).detail
    crowded = {**groups, PREFILL: [_pod("p0", PREFILL, "n2", "32")]}
    assert "share nodes" in placement_check(crowded, nodes, efa, per_node).detail


def test_verify_wants_a_rail_on_every_card_a_pod_holds() -> None:
    line = "I nixl: Created {} rails using provider=efa\nBackend LIBFABRIC was instantiated\n"
    assert nixl_log_findings(line.format(16), expected_rails=16).problems == []
    assert "fewer than the pod's 16 EFA devices" in " ".join(
        nixl_log_findings(line.format(1), expected_rails=16).problems
    )


def test_bench_labels_its_results_with_each_sides_tensor_parallel_size() -> None:
    described = describe_serve_config(serve_config(_settings("p5.48xlarge-70b")))
    sizes = {side: kwargs["tensor_parallel_size"] for side, kwargs in described["engine_kwargs"].items()}
    assert sizes == {PREFILL: 8, DECODE: 4}
    assert described["replicas"] == {PREFILL: 1, DECODE: 2}


# --- The reachability proof on multi-GPU pods ----------------------------------------------------------------
@pytest.mark.parametrize("name", IDS)
def test_every_nixl_side_channel_of_every_tp_rank_is_reachable(name: str) -> None:
    """Ray gives each replica's engine the side-channel ports base + rank x GPUs per replica upward
    (Ray 2.58 engines/vllm/kv_transfer/base.py), one per TP worker: each must be admitted between the pods."""

    settings = _settings(name)
    policies, peers, subnets = cluster(**CONFIGS[name])
    pairs = required_pairs(peers, subnets)
    ray = ray_pods(peers)
    for base, side in ((20000, PREFILL), (22000, DECODE)):
        ports = range(base, base + settings.side_replicas(side) * settings.tensor_parallel_size(side))
        pairs += [(a, b, port) for a in ray for b in ray for port in ports]
    assert refused(policies, pairs) == []


# --- plan and cost per tensor-parallel group ----------------------------------------------------------------
PLAN_ARGS = {name: [f"{k}={v}" for k, v in config.items()] for name, config in CONFIGS.items()}
# At 8k prompts: an 8B model on one L4 with host staging trades TTFT for ITL; a 70B model on four L40S
# or on p5 with GPUDirect RDMA is where the public gains are (HyperPod, Dynamo on p5).
VERDICTS_AT_8K = {"g6.8xlarge-defaults": "maybe", "g6e.12xlarge-tp4": "likely", "p5.48xlarge-70b": "likely"}


@pytest.mark.parametrize("name", IDS)
def test_plan_prints_each_configurations_verdict(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = [arg for pair in PLAN_ARGS[name] for arg in ("-c", pair)]
    assert main(args) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.lstrip().startswith("8192 ")]
    assert row.split()[-1] == VERDICTS_AT_8K[name], row
    assert sizing.disaggregation_verdict(_settings(name), 8192)[0] == VERDICTS_AT_8K[name]
    assert "Estimated cost: ~$" in out


def test_prefill_runs_at_the_gpus_throughput_times_the_tp_size() -> None:
    p5 = _settings("p5.48xlarge-70b")
    one_gpu = validate(
        Settings(**{**CONFIGS["p5.48xlarge-70b"], "prefill_tensor_parallel_size": 4, "prefill_replicas": 2})
    )
    assert sizing.prefill_seconds(p5, 8192) == pytest.approx(sizing.prefill_seconds(one_gpu, 8192) / 2)
    flops = 2 * p5.model.parameters_billion * 1e9 * 8192
    assert sizing.prefill_seconds(p5, 8192, 0.4) == pytest.approx(flops / (8 * 989e12 * 0.4))


def test_no_staging_where_gpudirect_applies_and_per_tp_worker_where_it_does_not() -> None:
    p5, g6e, g6 = (sizing.transfer_plan(_settings(n), 8192) for n in IDS[::-1])
    assert p5.staging_seconds == 0 and p5.decode_copy_stall_seconds == 0
    # Each of the four L40S stages a quarter of the KV, in parallel: both copies at 7.5 GB/s.
    assert g6e.staging_seconds == pytest.approx(2 * g6e.kv_bytes / 4 / 7.5e9)
    assert g6.staging_seconds == pytest.approx(2 * g6.kv_bytes / 7.5e9)


def test_efa_bandwidth_is_summed_across_the_cards_a_pod_holds() -> None:
    p5 = _settings("p5.48xlarge-70b")
    assert (sizing.pod_efa_gbps(p5, PREFILL), sizing.pod_efa_gbps(p5, DECODE)) == (3200, 1600)
    # The wire is bounded by NIXL inside vLLM (4-5 GB/s per TP worker, 4 workers at once), not by 1600 Gbps.
    plan = sizing.transfer_plan(p5, 8192)
    assert plan.efa_wire_seconds == pytest.approx(plan.kv_bytes / (4 * 4.5e9))
    # One L4 node: 25 Gbps (3.1 GB/s) is below NIXL's cap and bounds the wire.
    g6 = sizing.transfer_plan(_settings("g6.8xlarge-defaults"), 8192)
    assert g6.efa_wire_seconds == pytest.approx(g6.kv_bytes / (25e9 / 8))


def test_the_hourly_price_has_its_source() -> None:
    p5 = _settings("p5.48xlarge-70b")
    (gpu_line,) = [line for line in hourly_cost(p5) if "GPU nodes" in line.item]
    assert (gpu_line.count, gpu_line.unit_per_hour) == (2, 55.04)
    assert "p5.48xlarge at $55.04/h from datareceipts" in cost_summary(p5)
    assert "unconfirmed" in cost_summary(_settings("g6e.12xlarge-tp4"))
    assert "from" not in cost_summary(_settings("g6.8xlarge-defaults")).split("extra")[1]
