"""Sizing: the cold start and the scale-up budget of one more replica on a new GPU node."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from settings.model import Settings

# Reading the weights back from the node's NVMe RAID0: 2 GB/s, an assumption
# (unmeasured; EC2 publishes instance-store IOPS, not a sequential read rate).
NVME_READ_BYTES_PER_S = 2e9


# --- Cold start ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ColdStart:
    """Getting the weights onto a node: the first time, and after a pod restart."""

    weights_bytes: float
    # At the instance's network bandwidth: a floor, since neither the Hugging Face
    # CDN nor one S3 connection fills it (Ray's S3 path opens many in parallel).
    first_download_seconds: float
    # From the NVMe cache (instance-store types); None where there is none.
    nvme_reload_seconds: float | None
    # Ray 2.58 re-downloads an s3:// source on every start (it skips no file), so a
    # restart costs the first download again; a Hugging Face source is found in the cache.
    restart_seconds: float


def download_gbps(s: Settings) -> float:
    """What the weights download through: the ENA interface on network card 0, one card's share of the
    node's bandwidth (EFA-only interfaces on the other cards carry no IP traffic)."""
    return s.gpu_instance.network_gbps / s.gpu_instance.network_cards


def warm_node_holds_weights(s: Settings) -> bool:
    """Whether a warm node's placeholder fills the node's model cache: a Hugging Face model (vLLM finds it
    in HF_HOME), on a type with instance store (the cache's NVMe). Ray downloads an s3:// source again at
    every engine start, so a cache filled beforehand would go unread."""
    return s.model_source is None and s.gpu_instance.instance_store_gb > 0


def cold_start(s: Settings) -> ColdStart:
    weights = s.model.parameters_billion * 1e9 * s.model.dtype_bytes
    download = weights / (download_gbps(s) * 1e9 / 8)
    nvme = weights / NVME_READ_BYTES_PER_S if s.gpu_instance.instance_store_gb > 0 else None
    from_s3 = (s.model_source or "").startswith("s3://")
    restart = download if from_s3 or nvme is None else nvme
    return ColdStart(weights, download, nvme, restart)


# --- Admission, backpressure and draining (README "Scaling") -------------------------------------
# Ray Serve bounds every deployment twice: max_ongoing_requests per replica (Ray LLM's default is
# 1e9, constants.py DEFAULT_MAX_ONGOING_REQUESTS) and max_queued_requests per caller (a proxy or
# a replica holding a handle; -1, no limit, by default). Past the queue the router raises
# BackPressureError (serve/_private/router.py), which reaches the client as the deployment's
# backpressure_config.status_code with Retry-After (serve/_private/http_util.py).
#
# vLLM 0.26 keeps a prefill's KV blocks leased for 30 s after its one-token response, renewed by
# decode's heartbeats while decode still waits to read them (nixl/base_scheduler.py,


# serve/config.py, AutoscalingConfig.upscale_delay_s, default 30.0; serve_config keeps the default).
SERVE_UPSCALE_DELAY_S = 30.0
# Ray's autoscaler looks at pending bundles every 5 s (ray/autoscaler/_private/constants.py,
# AUTOSCALER_UPDATE_INTERVAL_S); Cluster Autoscaler reacts to the pending pod "less than 30 seconds
# in most cases" (kubernetes/autoscaler cluster-autoscaler/FAQ.md, "How fast is Cluster Autoscaler?").
RAY_AUTOSCALER_INTERVAL_S = 5.0
CLUSTER_AUTOSCALER_REACTION_S = 30.0
# From Cluster Autoscaler's request to a node pods can be scheduled on: "on GCE it usually takes 3 to
# 4 minutes" (the same FAQ). No AWS figure is published; the GPU node also waits for the NVIDIA and
# EFA device plugins before the worker pod fits.
NODE_LAUNCH_AND_JOIN_S = (180.0, 240.0)
# The serving image: AWS's Deep Learning Containers are 15-20 GB, and a standard pull of one "can
# take 4-6 minutes per instance" (AWS Machine Learning Blog, "Reducing container cold start times
# using SOCI index on DLAMI and DLC", 2026-06). The Ray LLM DLC's own size is not published and its
# registry cannot be reached from here: 20 GB, the top of that range, is assumed.
SERVING_IMAGE_GB = 20
IMAGE_PULL_S = (240.0, 360.0)
# SOCI's parallel pull and unpack (nodeadm's FastImagePull gate, on in the GPU launch template): 2.2x,
# "from 4 minutes 44 seconds to 2 minutes 12 seconds" for a 19.32 GB (compressed) image on a
# g5.4xlarge with a 1,000 MB/s gp3 volume, 20 downloads per image in 16 MB chunks and 10 unpacks (the
# AWS ML Blog post above). nodeadm v20260714 writes 20, 16mb and 12 (nodeadm/internal/containerd/
# snapshotter/soci-snapshotter.config.toml), on every instance it turns SOCI on for. The blog pulled
# from a private ECR repository, "as public ECR is fronted by Amazon CloudFront, which limits network
# bandwidth"; the serving image here is on public ECR, so the gain may be smaller. Unmeasured here.
PARALLEL_PULL_SPEEDUP = 2.2
# A warm node (gpu_warm_nodes): the scheduler evicts the placeholder, whose grace period is 0, and binds
# the Ray worker in the same scheduling cycle's aftermath; the container starts from an image already on
# the node. No published figure: 0-10 s, assumed.
WARM_NODE_BIND_AND_START_S = (0.0, 10.0)
# vLLM's start after the weights are on disk: the load into GPU memory, torch.compile and CUDA-graph
# capture with an empty compile cache (a new node's instance store is empty). The low end is
# measured on CPU: the rehearsal's new decode replica, engine start and pre-warm, about 60 s
# (rehearsal/node_loss.py), a floor without compilation, CUDA graphs or a GPU. The high end is an
# assumption, unmeasured.
ENGINE_START_S = (60.0, 180.0)


@dataclass(frozen=True)
class BudgetTerm:
    """One step between "a side needs another replica" and that replica serving."""

    what: str
    low_seconds: float
    high_seconds: float
    # Where the numbers come from: a source, "measured ...", or "assumed".
    source: str
    # The term is a lower bound only (the real time has no published upper end).
    floor: bool = False


# The cases `make plan` prints: where the new replica lands, and how the image arrives.
COLD_STANDARD_PULL = "a new node, standard image pull"
COLD = "a new node, parallel image pull (this stack)"
WARM = "a warm node (gpu_warm_nodes)"
SCALE_UP_CASES = (COLD_STANDARD_PULL, COLD, WARM)


def gpu_image_pull_seconds(*, parallel: bool = True) -> tuple[float, float]:
    """The serving image onto a GPU node that has never pulled it: nodeadm's parallel pull (FastImagePull,
    which the GPU launch template turns on) or containerd's standard one."""
    low, high = IMAGE_PULL_S
    return (low / PARALLEL_PULL_SPEEDUP, high / PARALLEL_PULL_SPEEDUP) if parallel else (low, high)


def scale_up_budget(s: Settings, case: str = COLD) -> list[BudgetTerm]:
    """The time to add one replica of a side, term by term: on a new GPU node (its NVMe cache empty, so
    the weights come from the source, a floor at the ENA card's line rate: cold_start), with the
    parallel pull this stack turns on or the standard one, or on a warm node, which has the image and,
    for a Hugging Face model, the weights in its cache (serve_config/warm_nodes.py).
    """
    start = cold_start(s)
    source = s.model_source or s.model_id
    serve = BudgetTerm(
        "Serve sees the load",
        SERVE_UPSCALE_DELAY_S,
        SERVE_UPSCALE_DELAY_S,
        "Ray 2.58 serve/config.py: upscale_delay_s default",
    )
    engine = BudgetTerm(
        "engine start",
        *ENGINE_START_S,
        "GPU load, torch.compile, CUDA graphs: ~60 s measured on CPU (the rehearsal's new decode replica, "
        "no compile, no GPU), 180 s assumed",
    )
    download = BudgetTerm(
        f"weights ({start.weights_bytes / 1e9:.1f} GB)",
        start.first_download_seconds,
        start.first_download_seconds,
        f"from {source} at {download_gbps(s):g} Gbps, a floor (cold_start): a new node's NVMe cache is empty",
        floor=True,
    )
    if case == WARM:
        weights = download
        if warm_node_holds_weights(s) and start.nvme_reload_seconds is not None:
            weights = BudgetTerm(
                f"weights ({start.weights_bytes / 1e9:.1f} GB)",
                start.nvme_reload_seconds,
                start.nvme_reload_seconds,
                "from the node's NVMe cache, which the placeholder filled; 2 GB/s assumed (cold_start)",
            )
        return [
            serve,
            BudgetTerm(
                "Ray adds the pod",
                0.0,
                RAY_AUTOSCALER_INTERVAL_S,
                "ray autoscaler constants.py (5 s loop); no new node, so no Cluster Autoscaler",
            ),
            BudgetTerm(
                "placeholder preempted, pod started",
                *WARM_NODE_BIND_AND_START_S,
                "assumed: placeholder grace period 0, the image on the node (serve_config/warm_node.yaml)",
            ),
            weights,
            engine,
        ]
    parallel = case == COLD
    pull_source = (
        f"standard pull / {PARALLEL_PULL_SPEEDUP:g}: AWS ML Blog, SOCI on DLAMI and DLC (2026-06), parallel pull "
        "4 min 44 s -> 2 min 12 s on a 19.3 GB image (from private ECR; this image is on public ECR)"
        if parallel
        else "AWS ML Blog, SOCI on DLAMI and DLC (2026-06): 15-20 GB DLC images, 4-6 min a standard pull"
    )
    return [
        serve,
        BudgetTerm(
            "Ray adds the pod, Cluster Autoscaler the node",
            0.0,
            RAY_AUTOSCALER_INTERVAL_S + CLUSTER_AUTOSCALER_REACTION_S,
            "ray autoscaler constants.py (5 s loop); kubernetes/autoscaler FAQ (< 30 s)",
        ),
        BudgetTerm(
            f"{s.gpu_instance_type} launch and node join",
            *NODE_LAUNCH_AND_JOIN_S,
            "kubernetes/autoscaler FAQ: 3-4 min on GCE; no AWS figure, unmeasured here",
        ),
        BudgetTerm(
            f"image pull (~{SERVING_IMAGE_GB} GB, {'parallel' if parallel else 'standard'})",
            *gpu_image_pull_seconds(parallel=parallel),
            pull_source,
        ),
        download,
        engine,
    ]


def scale_up_seconds(s: Settings, case: str = COLD) -> tuple[float, float]:
    """The scale-up budget summed: (low, high)."""
    terms = scale_up_budget(s, case)
    return sum(t.low_seconds for t in terms), sum(t.high_seconds for t in terms)


def seconds_before_any_pull(s: Settings) -> tuple[float, float]:
    """What a new node costs before its image pull starts: Serve's delay, the autoscalers and the launch."""
    terms = scale_up_budget(s, COLD)[:3]
    return sum(t.low_seconds for t in terms), sum(t.high_seconds for t in terms)
