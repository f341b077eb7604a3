"""Reference tables the settings are checked against and derived from.

Every constant here has its source next to it. Versions that move together
(Kubernetes and its kubectl layer, each Helm chart and its version, the Ray
version of the container image) live here once, so an upgrade is one edit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

# --- Kubernetes ------------------------------------------------------------
# EKS creates clusters on versions in standard or extended support
# (AWS EKS user guide, "kubernetes-versions"). On
# 2026-11-30 that is 1.32 to 1.36; 1.31 left extended support on 2026-11-26.
# Each version is paired with the PyPI package of its kubectl Lambda layer.
KUBERNETES_VERSIONS: Mapping[str, str] = MappingProxyType(
    {
        "1.32": "aws_cdk.lambda_layer_kubectl_v32",
        "1.33": "aws_cdk.lambda_layer_kubectl_v33",
        "1.34": "aws_cdk.lambda_layer_kubectl_v34",
        "1.35": "aws_cdk.lambda_layer_kubectl_v35",
        "1.36": "aws_cdk.lambda_layer_kubectl_v36",
    }
)
DEFAULT_KUBERNETES_VERSION = "1.36"
DEFAULT_SYSTEM_INSTANCE_TYPE = "m7i.xlarge"
DEFAULT_GPU_INSTANCE_TYPE = "g6.8xlarge"


def layer_package(kubernetes_version: str) -> str:
    """The PyPI name of a version's kubectl layer, e.g. aws-cdk.lambda-layer-kubectl-v36."""
    return "aws-cdk.lambda-layer-kubectl-v" + kubernetes_version.split(".")[1]


# --- Helm charts -----------------------------------------------------------
@dataclass(frozen=True)
class HelmChartPin:
    """A Helm chart pinned to one version, installed under a fixed release name."""

    chart: str
    repository: str
    version: str
    release: str
    namespace: str


# The tests render each pinned chart, the archive its repository below publishes (tools/dev/
# fetch_schemas.py fetches it and checks it against the sha256 digest of the repository's
# index.yaml), with the values the stack sets, through the helm of the kubectl layer.
KUBERAY_OPERATOR = HelmChartPin(
    chart="kuberay-operator",
    repository="https://ray-project.github.io/kuberay-helm/",
    version="1.7.0",
    release="kuberay-operator",
    namespace="kuberay-system",
)
NVIDIA_DEVICE_PLUGIN = HelmChartPin(
    chart="nvidia-device-plugin",
    repository="https://nvidia.github.io/k8s-device-plugin",
    version="0.20.0",
    release="nvidia-device-plugin",
    namespace="kube-system",
)
EFA_DEVICE_PLUGIN = HelmChartPin(
    chart="aws-efa-k8s-device-plugin",
    repository="https://aws.github.io/eks-charts",
    version="v0.5.30",
    release="aws-efa-k8s-device-plugin",
    namespace="kube-system",
)
# Helm installs a chart's CRDs once and never upgrades them (ray-project/kuberay#3133):
# a Job applies these, server-side, whenever KUBERAY_OPERATOR.version changes.
# RayCronJob is left out: whether v1.7.0 ships it is unconfirmed here, and this
# stack does not use it.
KUBERAY_CRDS = ("rayclusters", "rayjobs", "rayservices")
# Kubernetes' own kubectl image; this tag is in use in public manifests that
# apply CRDs server-side the same way (not pulled from here); change it here.
KUBECTL_IMAGE = "registry.k8s.io/kubectl:v1.36.4"


def kuberay_crd_urls(version: str) -> list[str]:
    base = f"https://raw.githubusercontent.com/ray-project/kuberay/v{version}/helm-chart/kuberay-operator/crds"
    return [f"{base}/ray.io_{name}.yaml" for name in KUBERAY_CRDS]


# Installed only when a setting asks for it.
# External Secrets Operator chart 2.9.0 (https://charts.external-secrets.io/index.yaml): the
# newest release whose archive the offline tests render; a chart the tests cannot render is
# not pinned.
EXTERNAL_SECRETS = HelmChartPin(
    chart="external-secrets",
    repository="https://charts.external-secrets.io",
    version="2.9.0",
    release="external-secrets",
    namespace="external-secrets",
)
# aws-cdk-lib 2.275 AlbControllerVersion.V3_2_2 (chart 3.2.2); its IAM policy is
# vendored from the same package in cdk_constructs/policies/.
AWS_LOAD_BALANCER_CONTROLLER = HelmChartPin(
    chart="aws-load-balancer-controller",
    repository="https://aws.github.io/eks-charts",
    version="3.2.2",
    release="aws-load-balancer-controller",
    namespace="kube-system",
)
# Installed only when the GPU group's maximum exceeds its minimum (docs/operations.md, "Cluster Autoscaler").
# Chart 9.59.0 (appVersion 1.35.0) is packaged from kubernetes/autoscaler's tag
# cluster-autoscaler-chart-9.59.0 (https://github.com/kubernetes/autoscaler/tree/cluster-autoscaler-chart-9.59.0/charts/cluster-autoscaler);
# the image tag is set per Kubernetes minor below.
CLUSTER_AUTOSCALER = HelmChartPin(
    chart="cluster-autoscaler",
    repository="https://kubernetes.github.io/autoscaler",
    version="9.59.0",
    release="cluster-autoscaler",
    namespace="kube-system",
)
# Cluster Autoscaler's minor follows Kubernetes' and is tested only against its own minor
# (kubernetes/autoscaler cluster-autoscaler/README.md, "Releases"): the newest patch of each,
# from the repository's tags cluster-autoscaler-1.32.7 ... -1.36.1. One row
# per KUBERNETES_VERSIONS key; a test keeps the two tables' keys equal.
CLUSTER_AUTOSCALER_IMAGE_TAGS: Mapping[str, str] = MappingProxyType(
    {
        "1.32": "v1.32.7",
        "1.33": "v1.33.6",
        "1.34": "v1.34.5",
        "1.35": "v1.35.2",
        "1.36": "v1.36.1",
    }
)
# Every chart the stack may install: the tests render each with the real helm.
ALL_CHARTS = (
    KUBERAY_OPERATOR,
    NVIDIA_DEVICE_PLUGIN,
    EFA_DEVICE_PLUGIN,
    EXTERNAL_SECRETS,
    AWS_LOAD_BALANCER_CONTROLLER,
    CLUSTER_AUTOSCALER,
)


# --- Container image ---------------------------------------------------------
# AWS Ray LLM Deep Learning Container v1.0 (aws/deep-learning-containers,
# docs/ray-llm, changelog 2026-08-31): Ray 2.58.0, vLLM 0.26.0, EFA libfabric,
# FI_PROVIDER=efa. The tests validate the serve config with ray[serve,llm]
# at IMAGE_RAY_VERSION (requirements-serve.lock pins the same number; a test
# checks they agree).
DEFAULT_RAY_IMAGE = "public.ecr.aws/deep-learning-containers/ray:serve-llm-cuda-v1.0.0"
# Amazon ECR Public's registry: the upstream an ECR pull-through cache rule of type ecr-public reads.
ECR_PUBLIC_REGISTRY = "public.ecr.aws"
IMAGE_RAY_VERSION = "2.58.0"
# What ray[llm]==2.58.0 pins (its wheel METADATA), and so the image's: verify checks
# them in a worker pod; a test keeps them equal to requirements-serve.lock.
IMAGE_VLLM_VERSION = "0.26.0"
IMAGE_NIXL_VERSION = "1.3.1"
# The image's CUDA 13.0.2 needs an NVIDIA driver of branch 580 or newer (NVIDIA's
# CUDA release notes; the AL2023 NVIDIA AMI for 1.36 ships 580.159.03): verify checks it.
IMAGE_MIN_NVIDIA_DRIVER = 580


# --- Instances ---------------------------------------------------------------
@dataclass(frozen=True)
class InstanceSpec:
    """What the stack needs to know about one EC2 instance type."""

    vcpus: int
    memory_gib: int
    efa_interfaces: int
    gpus: int
    gpu_model: str
    # Per GPU, what CUDA can allocate (less than the marketing figure).
    gpu_memory_gib: float
    gpudirect_rdma: bool
    network_gbps: float
    # Dense BF16 tensor TFLOPS per GPU (no sparsity), for the prefill estimate.
    gpu_bf16_tflops: float
    # Ray's accelerator_type name for the GPU (ray.util.accelerators).
    ray_accelerator_type: str
    # Pods the kubelet admits with the VPC CNI and no prefix delegation:
    # ENIs x (IPv4 addresses per ENI - 1) + 2 (amazon-eks-ami eni-max-pods.txt).
    max_pods: int
    # Local NVMe instance store in GB (0: EBS only), from each type's EC2
    # "instance store" specification (unconfirmed offline); nodeadm assembles it as RAID0.
    instance_store_gb: int = 0
    # Network cards (DescribeInstanceTypes NetworkInfo.MaximumNetworkCards); at most one
    # EFA per card, so efa_interfaces <= network_cards. preflight compares both with EC2.
    network_cards: int = 1
    # Whether the type takes EFA-only interfaces (EFA device, no ENA, no IP address). Where
    # it does, a multi-card type gets the EC2 User Guide's layout ("Maximize network
    # bandwidth on Amazon EC2 instances with multiple network cards"): card 0 device 0 ENA,
    # card 0 device 1 efa-only, every other card device 0 efa-only. Where unconfirmed, every
    # card gets an EFA-with-ENA interface, which every EFA type accepts.
    efa_only: bool = False
    # USD per hour on demand in PRICE_REGION; None: no price recorded. Sources in INSTANCE_PRICE_SOURCES.
    price_per_hour: float | None = None

    @property
    def efa_per_gpu(self) -> float:
        """EFA devices per GPU: a pod holding n GPUs holds n times this many."""
        return self.efa_interfaces / self.gpus if self.gpus else 0.0


# Sources: EC2 instance type pages (accelerated computing; network
# specifications: network cards and maximum EFA interfaces; EFA supported instance
# types) (g6.8xlarge, m7i.xlarge; GPUDirect RDMA only on p4d
# and later: aws/aws-ofi-nccl#547), NVIDIA datasheets for dense (non-sparse) BF16
# tensor TFLOPS: L4 121, L40S 362, A100 312, H100 SXM 989; A10G has no public
# datasheet, 70 is the A10's figure scaled to its clocks (unconfirmed).
# Network cards and EFA interfaces: EC2 User Guide "Network cards" and "Maximize
# network bandwidth ... multiple network cards" (p5.48xlarge: 32 EFA devices and one
# ENA, its run-instances example); the G types with EFA: one card, one EFA.
# g6e.48xlarge (4 cards, 4 EFA) and p4d.24xlarge (4 cards, 4 EFA) from the same
# network-specification table, read from memory and unconfirmed offline: preflight
# checks cards and EFA interfaces against DescribeInstanceTypes before a deploy.
# efa-only: documented for P5 (the example above); elsewhere unconfirmed, so False.
PRICE_REGION = "us-east-1"
INSTANCE_PRICE_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "g6.8xlarge": "AWS price list file for us-east-1, 2026-07-20",
        "m7i.xlarge": "AWS price list file for us-east-1, 2026-07-20",
        "m7i.2xlarge": "m7i.xlarge x 2 (EC2 on-demand scales linearly within a family)",
        "m7i.4xlarge": "m7i.xlarge x 4 (EC2 on-demand scales linearly within a family)",
        "p5.48xlarge": "datareceipts/data-receipts 109-gpu-pricing/hyperscalers.json, retrieved 2026-11-09 "
        "(third-party copy of the AWS price; unconfirmed against AWS's price file)",
        "p4d.24xlarge": "datareceipts/data-receipts 109-gpu-pricing/hyperscalers.json, retrieved 2026-11-09 "
        "(third-party copy of the AWS price; unconfirmed against AWS's price file)",
        "g6e.12xlarge": "Amazon EC2 G6e instance page, on-demand (read from memory; unconfirmed offline)",
    }
)
INSTANCE_TYPES: Mapping[str, InstanceSpec] = MappingProxyType(
    {
        "m7i.xlarge": InstanceSpec(4, 16, 0, 0, "", 0.0, False, 12.5, 0.0, "", 58, price_per_hour=0.2016),
        "m7i.2xlarge": InstanceSpec(8, 32, 0, 0, "", 0.0, False, 12.5, 0.0, "", 58, price_per_hour=0.4032),
        "m7i.4xlarge": InstanceSpec(16, 64, 0, 0, "", 0.0, False, 12.5, 0.0, "", 234, price_per_hour=0.8064),
        "m6i.xlarge": InstanceSpec(4, 16, 0, 0, "", 0.0, False, 12.5, 0.0, "", 58),
        "g6.8xlarge": InstanceSpec(
            32, 128, 1, 1, "L4", 22.5, False, 25.0, 121.0, "L4", 234, 900, price_per_hour=2.0144
        ),
        "g6.12xlarge": InstanceSpec(48, 192, 1, 4, "L4", 22.5, False, 40.0, 121.0, "L4", 234, 3760),
        "g6.16xlarge": InstanceSpec(64, 256, 1, 1, "L4", 22.5, False, 25.0, 121.0, "L4", 737, 1880),
        "g6.2xlarge": InstanceSpec(8, 32, 0, 1, "L4", 22.5, False, 10.0, 121.0, "L4", 58, 450),
        "g6e.8xlarge": InstanceSpec(32, 256, 1, 1, "L40S", 44.5, False, 25.0, 362.0, "L40S", 234, 900),
        "g6e.12xlarge": InstanceSpec(
            48, 384, 1, 4, "L40S", 44.5, False, 100.0, 362.0, "L40S", 234, 3800, price_per_hour=10.49264
        ),
        "g6e.48xlarge": InstanceSpec(
            192, 1536, 4, 8, "L40S", 44.5, False, 400.0, 362.0, "L40S", 737, 7600, network_cards=4
        ),
        "g5.8xlarge": InstanceSpec(32, 128, 1, 1, "A10G", 22.0, False, 25.0, 70.0, "A10G", 234, 900),
        "g5.12xlarge": InstanceSpec(48, 192, 1, 4, "A10G", 22.0, False, 40.0, 70.0, "A10G", 234, 3800),
        "p4d.24xlarge": InstanceSpec(
            96,
            1152,
            4,
            8,
            "A100",
            39.5,
            True,
            400.0,
            312.0,
            "A100-40G",
            737,
            8000,
            network_cards=4,
            price_per_hour=21.957642,
        ),
        "p5.48xlarge": InstanceSpec(
            192,
            2048,
            32,
            8,
            "H100",
            79.0,
            True,
            3200.0,
            989.0,
            "H100",
            100,
            30720,
            network_cards=32,
            efa_only=True,
            price_per_hour=55.04,
        ),
    }
)


# Peak memory bandwidth per GPU in bytes/s, by InstanceSpec.gpu_model, for the decode step's estimate
# (settings/sizing/latency.py): NVIDIA datasheets, L4 300 GB/s, L40S 864 GB/s, A100 40GB SXM 1,555 GB/s,
# H100 SXM 3.35 TB/s; A10G has no public datasheet, 600 GB/s is the A10's (unconfirmed).
GPU_MEMORY_BYTES_PER_S: Mapping[str, float] = MappingProxyType(
    {"L4": 300e9, "L40S": 864e9, "A10G": 600e9, "A100": 1555e9, "H100": 3350e9}
)

# nodeadm's localStorage strategy RAID0 (amazon-eks-ami setup-local-disks) mounts
# the array here and moves kubelet's and containerd's state onto it.
# The Ray GCS store's node types (ElastiCache for Valkey) with their on-demand USD per hour in PRICE_REGION, per
# node (the store runs two): Amazon ElastiCache pricing page, node-based Valkey, us-east-1, read from memory
# and unconfirmed offline (Valkey nodes are priced 20% below Redis OSS's: t4g.micro $0.016 -> $0.0128).
GCS_STORE_NODE_PRICES: Mapping[str, float] = MappingProxyType(
    {
        "cache.t4g.micro": 0.0128,
        "cache.t4g.small": 0.0256,
        "cache.t4g.medium": 0.0520,
        "cache.m7g.large": 0.1264,
        "cache.r7g.large": 0.1752,
    }
)
DEFAULT_GCS_STORE_NODE_TYPE = "cache.t4g.micro"
GCS_STORE_PRICE_SOURCE = "Amazon ElastiCache pricing page, node-based Valkey, us-east-1 (unconfirmed offline)"

LOCAL_NVME_MOUNT = "/mnt/k8s-disks/0"

# --- GPU node AMI ------------------------------------------------------------
# The EKS optimized AL2023 NVIDIA AMI the GPU node group is pinned to, per Kubernetes
# version: the node group's releaseVersion, "<kubernetes version>.<patch>-<YYYYMMDD>".
# Release v20260714 of awslabs/amazon-eks-ami (its CHANGELOG.md, "AMI Release
# v20260714", Release version column of amazon-eks-node-al2023-x86_64-nvidia-<k8s>);
# its NVIDIA driver for 1.36 is 580.159.03 (IMAGE_MIN_NVIDIA_DRIVER). Unpinned, every
# new node would take whichever release is newest when it launches, so the GPU
# nodes of one group could run different drivers and nodeadm versions.
GPU_AMI_RELEASE_VERSIONS: Mapping[str, str] = MappingProxyType(
    {
        "1.32": "1.32.13-20260714",
        "1.33": "1.33.13-20260714",
        "1.34": "1.34.9-20260714",
        "1.35": "1.35.6-20260714",
        "1.36": "1.36.2-20260714",
    }
)
# nodeadm's feature gate that points containerd at the SOCI snapshotter with parallel pull
# and unpack (the ~20 GB serving image); the AMI installs soci-snapshotter on every AL2023
# variant. nodeadm uses it only on nodes with at least 7 GiB of memory and 4 vCPUs
# (nodeadm/internal/containerd/config.go), which every GPU type here has (a test checks).
# The gates nodeadm knows, from the same release (tag v20260714, nodeadm/api/v1alpha1/
# nodeconfig_types.go, the featureGates validation enum); the NodeConfig's featureGates
# is a free map of booleans, so a misspelled gate would pass unseen.
FAST_IMAGE_PULL_GATE = "FastImagePull"
NODEADM_FEATURE_GATES: frozenset[str] = frozenset({"InstanceIdNodeName", FAST_IMAGE_PULL_GATE})


# --- Models ------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSpec:
    """Shape of a model, enough to size its weights, its KV cache and one step's activations."""

    parameters_billion: float
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    needs_token: bool
    # max_position_embeddings: vLLM refuses a longer max_model_len at startup
    # (vllm/config/model.py, _get_and_verify_max_len) unless told to allow it.
    max_context_tokens: int
    # hidden_size, intermediate_size (the MLP's width) and vocab_size: the
    # activation peak of a forward pass and the sampler's logits (settings/sizing/).
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    # vLLM's reasoning parser for the model, set as engine_kwargs.reasoning_parser on every
    # engine: a thinking model's thinking then comes back in the message's `reasoning`
    # field, its answer in `content`. None: the model does not think.
    reasoning_parser: str | None = None


# From each model's config.json on its Hugging Face model card
# (num_hidden_layers, num_key_value_heads, head_dim, torch_dtype,
# max_position_embeddings, hidden_size, intermediate_size, vocab_size) and the
# parameter count the card states. The reasoning parser: vLLM 0.26's table of
# reasoning models (https://docs.vllm.ai/en/v0.26.0/features/reasoning_outputs/,
# "Qwen3 series: qwen3"; the names vllm/reasoning/__init__.py registers); the
# other models here are not in it. Qwen3 thinks unless a request's
# chat_template_kwargs sets enable_thinking false (THINKING_OFF).
MODELS: Mapping[str, ModelSpec] = MappingProxyType(
    {
        "Qwen/Qwen3-8B": ModelSpec(
            8.19, 36, 8, 128, 2, False, 40960, hidden_size=4096, intermediate_size=12288, vocab_size=151936,
            reasoning_parser="qwen3",
        ),
        "Qwen/Qwen3-4B": ModelSpec(
            4.02, 36, 8, 128, 2, False, 40960, hidden_size=2560, intermediate_size=9728, vocab_size=151936,
            reasoning_parser="qwen3",
        ),
        "Qwen/Qwen3-14B": ModelSpec(
            14.8, 40, 8, 128, 2, False, 40960, hidden_size=5120, intermediate_size=17408, vocab_size=151936,
            reasoning_parser="qwen3",
        ),
        "Qwen/Qwen2.5-7B-Instruct": ModelSpec(
            7.62, 28, 4, 128, 2, False, 32768, hidden_size=3584, intermediate_size=18944, vocab_size=152064
        ),
        "meta-llama/Llama-3.1-8B-Instruct": ModelSpec(
            8.03, 32, 8, 128, 2, True, 131072, hidden_size=4096, intermediate_size=14336, vocab_size=128256
        ),
        "mistralai/Mistral-7B-Instruct-v0.3": ModelSpec(
            7.25, 32, 8, 128, 2, True, 32768, hidden_size=4096, intermediate_size=14336, vocab_size=32768
        ),
        # A 70B-class model: config.json of meta-llama/Llama-3.3-70B-Instruct (hidden_size 8192,
        # intermediate_size 28672, num_hidden_layers 80, num_attention_heads 64 so head_dim 128,
        # num_key_value_heads 8, vocab_size 128256, max_position_embeddings 131072, bfloat16;
        # the same as Llama-3.1-70B-Instruct's), 70.6B parameters per its card. Gated. Read
        # from copies of that config.json in public repositories (the Hub is unreachable here).
        "meta-llama/Llama-3.3-70B-Instruct": ModelSpec(
            70.6, 80, 8, 128, 2, True, 131072, hidden_size=8192, intermediate_size=28672, vocab_size=128256
        ),
    }
)  # fmt: skip
DEFAULT_MODEL_ID = "Qwen/Qwen3-8B"
# What a request's chat_template_kwargs holds to turn a reasoning parser's thinking off, by parser: the
# model's chat template then closes an empty think block in the prompt, and vLLM's parser starts in
# the answer (vLLM 0.26 vllm/parser/qwen3.py, Qwen3Parser reads enable_thinking, default true).
THINKING_OFF: Mapping[str, Mapping[str, object]] = MappingProxyType(
    {"qwen3": MappingProxyType({"enable_thinking": False})}
)


# --- Regions -------------------------------------------------------------------
# Availability zone names per region, from EC2 DescribeAvailabilityZones as
# documented in each region's AWS "Regions and Zones" page. Unconfirmed
# offline; an AZ name outside this table is refused at synth so a typo never
# reaches a deploy. Which of them offer g6.8xlarge varies by account: check
# with `aws ec2 describe-instance-type-offerings --location-type availability-zone`.
REGION_AZS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "us-east-1": ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1e", "us-east-1f"),
        "us-east-2": ("us-east-2a", "us-east-2b", "us-east-2c"),
        "us-west-2": ("us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"),
        "eu-west-1": ("eu-west-1a", "eu-west-1b", "eu-west-1c"),
        "eu-central-1": ("eu-central-1a", "eu-central-1b", "eu-central-1c"),
        "eu-north-1": ("eu-north-1a", "eu-north-1b", "eu-north-1c"),
        "ap-northeast-1": ("ap-northeast-1a", "ap-northeast-1c", "ap-northeast-1d"),
        "ap-southeast-2": ("ap-southeast-2a", "ap-southeast-2b", "ap-southeast-2c"),
        "ap-south-1": ("ap-south-1a", "ap-south-1b", "ap-south-1c"),
    }
)


# --- Account (tools/preflight) -------------------------------------------------
# The default synthesizer's qualifier, and the bootstrap versions a synthesized
# assembly requires (cdk.out/manifest.json requiresBootstrapStackVersion: 6 to
# deploy and publish assets, 8 for the lookup role an existing VPC's lookup
# assumes). A test reads both back from a synthesized assembly.
CDK_BOOTSTRAP_QUALIFIER = "hnb659fds"
CDK_BOOTSTRAP_MIN_VERSION = 6
CDK_BOOTSTRAP_LOOKUP_MIN_VERSION = 8


@dataclass(frozen=True)
class Quota:
    """One Service Quotas quota, by service and quota code, with its console name and a short label."""

    service: str
    code: str
    name: str
    label: str


# Service Quotas codes (AWS General Reference, "Amazon EC2 endpoints and quotas"
# and "Amazon VPC endpoints and quotas"). The On-Demand vCPU quotas are Service
# Quotas' own, in service ec2 (`aws service-quotas list-service-quotas --service-code ec2`;
# botocore has no mapping from instance type to quota): each quota's name lists the
# families it counts.
GVT_VCPUS = Quota("ec2", "L-DB2E81BA", "Running On-Demand G and VT instances", "G and VT vCPUs")
P_VCPUS = Quota("ec2", "L-417A185B", "Running On-Demand P instances", "P vCPUs")
STANDARD_VCPUS = Quota(
    "ec2", "L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", "standard vCPUs"
)
ELASTIC_IPS = Quota("ec2", "L-0263D0A3", "EC2-VPC Elastic IPs", "Elastic IPs")
VPCS = Quota("vpc", "L-F678F1CE", "VPCs per Region", "VPCs")
INTERNET_GATEWAYS = Quota("vpc", "L-A4707A72", "Internet gateways per Region", "internet gateways")
NAT_GATEWAYS_PER_AZ = Quota("vpc", "L-FE5A380F", "NAT gateways per Availability Zone", "NAT gateways per AZ")
# The vCPU quota that counts an instance, by its family's letters (the type's name up to its first
# digit: g6e.12xlarge -> g, p4d.24xlarge -> p, im4gn.large -> im). p4d and p5 count against
# P, g5, g6 and g6e against G and VT, m7i against Standard. Families with quotas of their own
# (inf, trn, dl, hpc, x, u, f, mac) are in none of these three, so they are left out.
VCPU_QUOTA_BY_FAMILY_LETTERS: Mapping[str, Quota] = MappingProxyType(
    {
        "g": GVT_VCPUS,
        "gr": GVT_VCPUS,
        "vt": GVT_VCPUS,
        "p": P_VCPUS,
        **{letters: STANDARD_VCPUS for letters in ("a", "c", "d", "h", "i", "im", "is", "m", "r", "t", "z")},
    }
)


def vcpu_quota(instance_type: str) -> Quota | None:
    """The On-Demand vCPU quota that counts this instance type, or None for a family outside the table."""
    family = instance_type.split(".", 1)[0]
    letters = family[: len(family) - len(family.lstrip("abcdefghijklmnopqrstuvwxyz"))]
    return VCPU_QUOTA_BY_FAMILY_LETTERS.get(letters)


# A managed node group update (new AMI, launch template) first raises the group's
# size by the larger of twice its number of AZs or maxUnavailable (default 1),
# and only then drains old nodes (EKS user guide, "Understand each phase of node
# updates", scale up phase): up to two extra nodes per AZ at once.
NODE_UPDATE_SURGE_PER_AZ = 2
