"""Run the product's own P/D application on this CPU: real vLLM engines, real NIXL LIBFABRIC transfers.

    python -m rehearsal.run [--case pd|aggregated|ucx|wrong-side-channel|no-plugin] [--logs DIR] [--results DIR]

The serve config and the workers' environment come from the synthesized
template (the RayService's serveConfigV2 and worker container), changed only
by CPU_DELTAS below. It is deployed the way KubeRay deploys it (PUT to the
dashboard's /api/serve/applications/, with the cluster's token in the
x-ray-authorization header when the RayService turns Ray token authentication
on, as KubeRay does), and checked with `verify`'s own functions, with
libfabric's tcp provider expected instead of efa. With token authentication on,
it also checks that the dashboard refuses a deploy and a job without the token.

It runs as two Ray nodes in two network namespaces of its own (unshare --net,
as root or with --map-root-user), joined by a veth pair with private
addresses, as the prefill and decode pods are on two nodes: libfabric's tcp
provider refuses the loopback interface, an address of one node is remote to
the other, and no traffic leaves the sandbox. Exit 0 when every check passes; on failure the Ray and
engine logs are copied to --logs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rehearsal import native
from serve_config import SERVE_PORT
from tools.cluster_access import RAY_METRICS_PORT

ROOT = Path(__file__).resolve().parent.parent
# Node A (this namespace): the Ray head and prefill. Node B (a second namespace): decode.
HEAD_IP, HEAD_IFACE = "10.99.0.1", "rh0"
WORKER_IP, WORKER_IFACE = "10.99.0.2", "rh1"
DASHBOARD = f"http://{HEAD_IP}:8265"
SERVE = f"http://{HEAD_IP}:{SERVE_PORT}"
# Each node exports its own processes' metrics, as each pod does on EKS.
PREFILL_METRICS = f"http://{HEAD_IP}:{RAY_METRICS_PORT}/metrics"
DECODE_METRICS = f"http://{WORKER_IP}:{RAY_METRICS_PORT}/metrics"
IN_NAMESPACE = "PD_REHEARSAL_IN_NETNS"

# The only changes made to the product's serve config, and why (a test pins this set).
CPU_DELTAS: dict[str, str] = {
    "model_loading_config.model_source": "a tiny Qwen3 made at test time (no hub); model_id stays the product's",
    "accelerator_type": "removed: with an accelerator Ray LLM takes its GPU path ('platform cpu does not support ray')",
    "placement_group_config.bundles[].GPU": "removed, for the same reason; CPU and the side's resource stay",
    "engine_kwargs.enforce_eager": "True: no CUDA graphs or torch.compile warm-up on CPU",
    "engine_kwargs.max_num_batched_tokens": "512: a CPU-sized batch",
    "engine_kwargs.max_num_seqs": "8: a CPU-sized batch",
    "engine_kwargs.dtype": "float32: this CPU has no fast bfloat16 path",
    "runtime_env.env_vars.VLLM_CPU_OMP_THREADS_BIND": "one core per side (0 prefill, 1 decode); aggregated: both",
}
# Environment of the Ray processes here, beside the product's worker environment.
CPU_ENV = {
    "FI_PROVIDER": "tcp",  # replaces the product's efa: no EFA device here (FI_TCP_IFACE: per node)
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "TORCH_COMPILE_DISABLE": "1",
    "HF_HUB_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}
CORES = {"prefill": "0", "decode": "1", "aggregated": "0-1"}
CASE_NAMES = ("pd", "aggregated", "ucx", "wrong-side-channel", "no-plugin")
# The cases that deploy the product in another serving mode (a setting, as a user would set it).
CASE_SETTINGS = {"aggregated": {"serving_mode": "aggregated"}}
DEPLOY_TIMEOUT_S = 720.0


class RehearsalError(RuntimeError):
    """One line saying what failed."""


# --- What the product deploys, and the CPU deltas -----------------------------------------
def product_rayservice(overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """The RayService in the synthesized template, on default settings (or with these overrides)."""
    os.environ.setdefault("CDK_VALIDATION", "false")
    from app import STACK_NAME, build_app
    from settings import project_context
    from tools.review import render

    context = {**project_context(ROOT), **(overrides or {})}
    with tempfile.TemporaryDirectory() as out:
        os.environ["CDK_OUTDIR"] = out
        app, _, _ = build_app(context)
        template = app.synth().get_stack_by_name(STACK_NAME).template
    for resource in template["Resources"].values():
        if resource["Type"] != "Custom::AWSCDK-EKS-KubernetesResource":
            continue
        for doc in json.loads(render(resource["Properties"]["Manifest"])):
            if doc.get("kind") == "RayService":
                return dict(doc)
    raise RehearsalError("no RayService in the synthesized template")


def cpu_serve_config(rayservice: dict[str, Any], model_dir: Path) -> dict[str, Any]:
    """serveConfigV2 with CPU_DELTAS applied, and nothing else changed."""
    config: dict[str, Any] = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    for app in config["applications"]:
        args = app["args"]
        llms = (
            [("aggregated", c) for c in args["llm_configs"]]
            if "llm_configs" in args
            else [(key.removesuffix("_config"), c) for key, c in args.items()]
        )
        for side, llm in llms:
            llm["model_loading_config"]["model_source"] = str(model_dir)
            llm.pop("accelerator_type", None)
            for bundle in llm["placement_group_config"]["bundles"]:
                bundle.pop("GPU", None)
            llm["engine_kwargs"].update(enforce_eager=True, max_num_batched_tokens=512, max_num_seqs=8, dtype="float32")
            env = llm.setdefault("runtime_env", {}).setdefault("env_vars", {})
            env["VLLM_CPU_OMP_THREADS_BIND"] = CORES[side]
    return config


def product_worker_env(rayservice: dict[str, Any]) -> dict[str, str]:
    """The plain-value environment of the product's worker containers (both groups share it)."""
    env: dict[str, str] = {}
    for group in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        for item in group["template"]["spec"]["containers"][0].get("env", []):
            if "value" in item:
                env[item["name"]] = str(item["value"])
    return env


def kuberay_auth_env(rayservice: dict[str, Any]) -> dict[str, str]:
    """What KubeRay 1.7 puts in every Ray container for `authOptions: {mode: token}`.

    It generates a random token into a Secret of the cluster and sets RAY_AUTH_MODE
    and RAY_AUTH_TOKEN (a secretKeyRef to it) in the head and every worker
    (controllers/ray/common/pod.go, utils.RAY_AUTH_TOKEN_SECRET_KEY "auth_token").
    """
    options = rayservice["spec"]["rayClusterConfig"].get("authOptions") or {}
    if options.get("mode") != "token":
        return {}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def kuberay_headers(env: dict[str, str]) -> dict[str, str]:
    """The header KubeRay's dashboard client sets on every call (dashboard_httpclient.go, setAuthHeader)."""
    token = env.get("RAY_AUTH_TOKEN")
    return {"x-ray-authorization": f"Bearer {token}"} if token else {}


# --- The network namespaces -----------------------------------------------------------------
def in_namespace(argv: list[str]) -> int:
    """Run this module again inside a new network namespace (node A); its exit code."""
    command = ["unshare", "--net"]
    if os.geteuid() != 0:
        command.append("--map-root-user")
    env = {**os.environ, IN_NAMESPACE: "1"}
    return subprocess.run([*command, sys.executable, "-m", "rehearsal.run", *argv], env=env, check=False).returncode


@dataclass
class Nodes:
    """Node A is this namespace (Ray head, prefill); node B a second one (decode), held open by a sleeper."""

    holder: subprocess.Popen[bytes]

    @property
    def node_b(self) -> list[str]:
        """A command prefix that runs its command in node B's namespace."""
        return ["nsenter", f"--net=/proc/{self.holder.pid}/ns/net"]


def set_up_network() -> Nodes:
    """Two namespaces joined by a veth pair, as two pods on two nodes: every address of one is remote to the other."""
    holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"])
    mine = os.readlink("/proc/self/ns/net")
    deadline = time.monotonic() + 10
    while os.readlink(f"/proc/{holder.pid}/ns/net") == mine:
        if time.monotonic() > deadline:
            raise RehearsalError("the second network namespace did not come up")
        time.sleep(0.05)
    nodes = Nodes(holder)
    for command in (
        ["ip", "link", "set", "lo", "up"],
        ["ip", "link", "add", HEAD_IFACE, "type", "veth", "peer", "name", WORKER_IFACE],
        ["ip", "link", "set", WORKER_IFACE, "netns", str(holder.pid)],
        ["ip", "addr", "add", f"{HEAD_IP}/24", "dev", HEAD_IFACE],
        ["ip", "link", "set", HEAD_IFACE, "up"],
        [*nodes.node_b, "ip", "link", "set", "lo", "up"],
        [*nodes.node_b, "ip", "addr", "add", f"{WORKER_IP}/24", "dev", WORKER_IFACE],
        [*nodes.node_b, "ip", "link", "set", WORKER_IFACE, "up"],
    ):
        subprocess.run(command, check=True)
    return nodes


# --- Ray --------------------------------------------------------------------------------------
def _http(
    url: str,
    body: Any = None,
    method: str | None = None,
    timeout: float = 30.0,
    headers: dict[str, str] | None = None,
) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(  # noqa: S310 - an address inside our own namespace
        url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        text = response.read().decode()
    return json.loads(text) if text.strip() else None


def _status(url: str, body: Any, method: str, headers: dict[str, str]) -> int:
    """The HTTP status of one call (an error status is an answer here, not a failure)."""
    try:
        _http(url, body, method=method, headers=headers)
    except urllib.error.HTTPError as err:
        return err.code
    return 200


@contextlib.contextmanager
def ray_cluster(env: dict[str, str], temp_dir: Path, nodes: Nodes) -> Iterator[None]:
    """The Ray head with prefill's resource on node A, a worker with decode's on node B, as KubeRay's groups."""
    ray = str(Path(sys.executable).parent / "ray")
    common = ["--num-cpus=6", f"--metrics-export-port={RAY_METRICS_PORT}", "--disable-usage-stats"]
    head = [
        ray, "start", "--head", f"--node-ip-address={HEAD_IP}", "--port=6379", f"--dashboard-host={HEAD_IP}",
        f"--temp-dir={temp_dir}", f"--resources={json.dumps({'prefill': 1})}", *common,
    ]  # fmt: skip
    worker = [
        *nodes.node_b, ray, "start", f"--address={HEAD_IP}:6379", f"--node-ip-address={WORKER_IP}",
        f"--resources={json.dumps({'decode': 1})}", *common,
    ]  # fmt: skip
    try:
        subprocess.run(head, env={**env, "FI_TCP_IFACE": HEAD_IFACE}, check=True, timeout=180)
        subprocess.run(worker, env={**env, "FI_TCP_IFACE": WORKER_IFACE}, check=True, timeout=180)
        yield
    finally:
        # Not `ray stop`: it finds Ray processes by name on the whole machine, other
        # namespaces included, and would stop any other Ray running here.
        kill_namespace_processes(f"/proc/{nodes.holder.pid}/ns/net", nodes.holder.pid)


def _parents() -> dict[int, int]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                found[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    return found


def kill_namespace_processes(other: str, holder_pid: int) -> int:
    """Kill every process left in this network namespace and in node B's: Ray's daemons, the engines
    and vLLM's worker processes, which would otherwise slow every later case. Our own descendants
    (jsii's Node process) end with us and are spared; Ray's daemons were reparented."""
    namespaces = {os.readlink("/proc/self/ns/net"), os.readlink(other)}
    parents = _parents()

    def ours(pid: int) -> bool:
        while pid > 1:
            if pid == holder_pid:
                return False
            if pid == os.getpid():
                return True
            pid = parents.get(pid, 0)
        return False

    killed = 0
    for pid in parents:
        if pid in (os.getpid(), os.getppid()) or ours(pid):
            continue
        try:
            if os.readlink(f"/proc/{pid}/ns/net") in namespaces:
                os.kill(pid, signal.SIGKILL)
                killed += 1
        except OSError:
            continue
    return killed


# An engine that cannot start, or decode's pre-warm through prefill failing: Serve would
# retry the replica for minutes before giving up.
ENGINE_FAILED = re.compile(
    r"createBackend: unsupported backend.*|Skipping backend registration.*|Engine core initialization failed.*|"
    r"NIXL transfer failure: handshake_\w+"
)


def auth_checks(config: dict[str, Any], env: dict[str, str]) -> list[Any]:
    """With token authentication on: a deploy or a job without the token is refused (401), a wrong token too (403)."""
    from tools.verify import Check

    if not kuberay_headers(env):
        return []
    job = {"entrypoint": "python -c 'print(1)'"}
    wrong = {"x-ray-authorization": f"Bearer {secrets.token_hex(32)}"}
    found = []
    for name, url, body, method, headers, expected in (
        ("a deploy without the token is refused", "/api/serve/applications/", config, "PUT", {}, 401),
        ("a job without the token is refused", "/api/jobs/", job, "POST", {}, 401),
        ("a job with a wrong token is refused", "/api/jobs/", job, "POST", wrong, 403),
    ):
        status = _status(f"{DASHBOARD}{url}", body, method, headers)
        found.append(Check(f"dashboard: {name}", status == expected, f"HTTP {status} (expected {expected})"))
    return found


def deploy(config: dict[str, Any], temp_dir: Path, headers: dict[str, str]) -> None:
    """PUT the serve config to the dashboard, as KubeRay does (with its token header), and wait until the app runs."""
    _http(f"{DASHBOARD}/api/serve/applications/", config, method="PUT", timeout=60, headers=headers)
    deadline = time.monotonic() + DEPLOY_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        fatal = ENGINE_FAILED.findall(ray_logs(temp_dir))
        if fatal:
            # NIXL's own line first, where there is one.
            first = sorted(fatal, key=lambda line: "Engine core" in line)[0]
            raise RehearsalError(f"deploy failed: an engine could not start or pre-warm: {first.strip()[:200]}")
        with contextlib.suppress(OSError, ValueError):
            status = _http(f"{DASHBOARD}/api/serve/applications/", headers=headers)
            app = (status or {}).get("applications", {}).get(config["applications"][0]["name"], {})
            last = str(app.get("status"))
            if last == "RUNNING":
                return
            if last == "DEPLOY_FAILED":
                raise RehearsalError(f"deploy failed: {(app.get('message') or '').strip().splitlines()[-1:]}")
        time.sleep(5)
    raise RehearsalError(f"the app was not RUNNING after {DEPLOY_TIMEOUT_S:.0f} s (last status {last})")


# --- Checks: verify's own functions -------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    checks: list[Any]
    log_lines: list[str]
    metrics: dict[str, float | None]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def ray_logs(temp_dir: Path) -> str:
    logs = temp_dir / "session_latest" / "logs"
    parts = []
    # old/: where Ray's log monitor moves the files of processes that have exited.
    for pattern in ("*.out", "*.err", "serve/*.log", "old/*.out", "old/*.err"):
        for path in sorted(logs.glob(pattern)):
            with contextlib.suppress(OSError):
                parts.append(path.read_text(errors="replace"))
    return "\n".join(parts)


def _metrics_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - our namespaces
        return str(response.read().decode())


def all_prompt_tokens() -> float | None:
    """Both nodes' prompt-token counters summed; None before either exports one."""
    from tools.cluster_access import PROMPT_TOKENS, metric_total

    found = [metric_total(_metrics_text(url), PROMPT_TOKENS) for url in (PREFILL_METRICS, DECODE_METRICS)]
    present = [value for value in found if value is not None]
    return sum(present) if present else None


def check(model_id: str, temp_dir: Path, expected_provider: str, aggregated: bool = False) -> Outcome:
    from tools.cluster_access import PROMPT_TOKENS, NixlSnapshot, http_json, metric_total
    from tools.verify import (
        Check,
        chat_check,
        grew,
        guard,
        metrics_check,
        models_check,
        nixl_log_findings,
        no_nixl_check,
        poll,
        poll_until_grown,
        prefill_check,
        served_check,
    )

    def decode_counters() -> NixlSnapshot:
        return NixlSnapshot.of(_metrics_text(DECODE_METRICS))

    def prefill_tokens() -> float | None:
        return metric_total(_metrics_text(PREFILL_METRICS), PROMPT_TOKENS)

    def api() -> list[Any]:
        """The endpoint's two calls; only after every counter's baseline is taken."""
        return [
            guard("GET /v1/models", lambda: models_check(http_json(f"{SERVE}/v1/models", timeout=120), model_id)),
            guard("POST /v1/chat/completions", lambda: chat_check(SERVE, model_id)),
        ]

    if aggregated:
        # The same checks `verify` makes in aggregated mode: a replica served it, and no NIXL anywhere.
        tokens_before = all_prompt_tokens()
        checks = api()
        checks.append(served_check(tokens_before, poll(all_prompt_tokens, grew(tokens_before))))
        node_metrics = {"node A": _metrics_text(PREFILL_METRICS), "node B": _metrics_text(DECODE_METRICS)}
        checks.append(no_nixl_check(node_metrics, {"Ray and engine logs": ray_logs(temp_dir)}))
        return Outcome(checks, [], {"prompt_tokens_before": tokens_before, "prompt_tokens_after": all_prompt_tokens()})

    before = decode_counters()
    # Decode's pre-warm already went through prefill: wait for Ray to export that, so that only
    # the chat below can make prefill's count grow.
    prompt_before = poll(prefill_tokens, lambda value: value is not None)
    checks = api()
    after = poll_until_grown(decode_counters, before)
    checks.append(metrics_check(before, after))
    checks.append(prefill_check(prompt_before, poll(prefill_tokens, grew(prompt_before))))
    text = ray_logs(temp_dir)
    findings = nixl_log_findings(text, expected_provider)
    checks.insert(0, Check("NIXL LIBFABRIC backend, no fallback", not findings.problems, "; ".join(findings.problems)))
    lines = [
        line.strip()
        for line in text.splitlines()
        if any(k in line for k in ("was instantiated", "rails using provider", "Skipping backend", "TCP fallback"))
    ]
    metrics: dict[str, float | None] = {
        "transfers_before": before.transfers,
        "transfers_after": after.transfers,
        "failed": after.failed,
    }
    return Outcome(checks, sorted(set(lines))[:12], metrics)


# --- Main -------------------------------------------------------------------------------------
BENCH_POINTS = ((128, 1), (512, 2))
BENCH_OUTPUT_LEN = 16
BENCH_PROMPTS = 4


def short_bench(model_id: str, model_dir: Path, out: Path, headers: dict[str, str], aggregated: bool) -> None:
    """tools.bench's own sweep, at two small load points: results.csv, results.png and metadata.json in out/."""
    from tools import bench
    from tools.cluster_access import NixlSnapshot
    from tools.verify import grew, poll, poll_until_grown

    def snapshot() -> NixlSnapshot:
        return NixlSnapshot.of(_metrics_text(DECODE_METRICS))

    out.mkdir(parents=True, exist_ok=True)
    # Labelled from the live application, as bench labels a deployment from the live RayService.
    live = _http(f"{DASHBOARD}/api/serve/applications/", headers=headers)
    deployed = [app["deployed_app_config"] for app in live["applications"].values()]
    metadata = {
        "source": "the rehearsal's live Serve application",
        **bench.describe_serve_config({"applications": deployed}),
    }
    (out / "metadata.json").write_text(json.dumps(metadata, indent=2))
    rows = []
    for input_len, concurrency in BENCH_POINTS:
        point = bench.Point(input_len, concurrency)
        name = f"run-{input_len}-{concurrency}.json"
        before, tokens_before = snapshot(), all_prompt_tokens()
        command = bench.bench_command(
            base_url=SERVE, model=model_id, point=point, output_len=BENCH_OUTPUT_LEN, num_prompts=BENCH_PROMPTS,
            result_dir=out, result_file=name, tokenizer=str(model_dir),
        )  # fmt: skip
        subprocess.run(command, check=True, cwd=ROOT, timeout=600, capture_output=True)
        # Ray exports counters every 10 s: wait for this point's requests before the next point.
        if aggregated:
            poll(all_prompt_tokens, grew(tokens_before))
            after = snapshot()
        else:
            after = poll_until_grown(snapshot, before)
        rows.append(bench.row(point, json.loads((out / name).read_text()), before, after))
    bench.write_csv(rows, out / "results.csv")
    mode = metadata["serving_mode"]
    bench.write_chart(rows, out / "results.png", f"CPU rehearsal: {model_id} (tiny stand-in), {mode}")
    print(f"bench ({mode}): {out / 'results.csv'}, {out / 'results.png'}")


def run(case: str, logs_out: Path | None, results: Path | None = None) -> int:
    from tools.verify import table

    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="pd-rehearsal-"))
    phases: dict[str, float] = {}
    try:
        nodes = set_up_network()
        libs = native.ensure()
        phases["native"] = time.monotonic() - started
        from rehearsal.make_model import make

        model_dir = make(work / "model")
        phases["model"] = time.monotonic() - started
        rayservice = product_rayservice(CASE_SETTINGS.get(case))
        aggregated = "llm_configs" in yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"][0]["args"]
        config = cpu_serve_config(rayservice, model_dir)
        env = {**os.environ, **product_worker_env(rayservice), **kuberay_auth_env(rayservice), **CPU_ENV}
        env["LD_LIBRARY_PATH"] = ":".join([*libs.library_dirs, env.get("LD_LIBRARY_PATH", "")])
        # The product's HF_HOME is the GPU node's NVMe hostPath, which does not exist here.
        env["HF_HOME"] = str(work / "huggingface")
        apply_case(case, config, env, libs)
        phases["config"] = time.monotonic() - started
        temp_dir = work / "ray"
        with ray_cluster(env, temp_dir, nodes):
            try:
                refusals = auth_checks(config, env)
                deploy(config, temp_dir, kuberay_headers(env))
                phases["deploy"] = time.monotonic() - started
                outcome = check(_model_id(config), temp_dir, "tcp", aggregated)
                outcome.checks[:0] = refusals
                phases["checks"] = time.monotonic() - started
                if case in ("pd", "aggregated") and outcome.ok and results is not None:
                    short_bench(_model_id(config), model_dir, results, kuberay_headers(env), aggregated)
                    phases["bench"] = time.monotonic() - started
            except Exception:
                _keep_logs(temp_dir, logs_out)
                _print_evidence(temp_dir)
                raise
        print(table(outcome.checks))
        print("NIXL log lines seen:", *outcome.log_lines, sep="\n  ")
        print(f"metrics: {outcome.metrics}")
        print("phases (s, cumulative): " + ", ".join(f"{k} {v:.0f}" for k, v in phases.items()))
        if not outcome.ok:
            _keep_logs(temp_dir, logs_out)
            _print_evidence(temp_dir)
            failed = [c for c in outcome.checks if not c.ok]
            print(f"rehearsal FAILED ({case}): {failed[0].name}: {failed[0].detail}", file=sys.stderr)
            return 1
        print(f"rehearsal passed ({case}) in {time.monotonic() - started:.0f} s")
        return 0
    except (RehearsalError, subprocess.CalledProcessError, OSError, urllib.error.URLError) as err:
        print(f"rehearsal FAILED ({case}): {err}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _model_id(config: dict[str, Any]) -> str:
    args = config["applications"][0]["args"]
    llm = args["llm_configs"][0] if "llm_configs" in args else args["decode_config"]
    return str(llm["model_loading_config"]["model_id"])


def apply_case(case: str, config: dict[str, Any], env: dict[str, str], libs: native.Libraries) -> None:
    """The failure cases: each breaks one thing the product relies on."""
    args = config["applications"][0]["args"]
    if case == "ucx":
        for side in ("prefill", "decode"):
            kv = args[f"{side}_config"]["engine_kwargs"]["kv_transfer_config"]
            kv["kv_connector_extra_config"]["backends"] = ["UCX"]
    elif case == "wrong-side-channel":
        # Prefill advertises a side-channel host decode cannot reach (ray-project/ray#60817):
        # its own loopback, which on decode's node is decode's loopback.
        env_vars = args["prefill_config"].setdefault("runtime_env", {}).setdefault("env_vars", {})
        env_vars["VLLM_NIXL_SIDE_CHANNEL_HOST"] = "127.0.0.1"
    elif case == "no-plugin":
        env["LD_LIBRARY_PATH"] = ":".join(d for d in env["LD_LIBRARY_PATH"].split(":") if d != libs.libfabric_dir)
    elif case not in ("pd", "aggregated"):
        raise RehearsalError(f"unknown case {case!r}")


# What NIXL, vLLM and Ray say when the KV path breaks: shown with a failed run.
EVIDENCE = re.compile(
    r"Skipping backend registration|unsupported backend|KeyError|Backend UCX was instantiated|"
    r"NIXL transfer failure: \w+|NIXL_ERR|Failed to load KV|No network devices"
)


def _print_evidence(temp_dir: Path) -> None:
    lines = sorted({line.strip()[:300] for line in ray_logs(temp_dir).splitlines() if EVIDENCE.search(line)})
    if lines:
        print("what the logs say:", *lines[:10], sep="\n  ", file=sys.stderr)


def _keep_logs(temp_dir: Path, logs_out: Path | None) -> None:
    if logs_out is None:
        return
    source = temp_dir / "session_latest" / "logs"
    if source.exists():
        try:
            shutil.copytree(source, logs_out, dirs_exist_ok=True, symlinks=False, ignore_dangling_symlinks=True)
        except shutil.Error as err:
            # Ray's log monitor moves a dead process's files into logs/old/ while we copy:
            # keeping logs is best effort and must never replace the failure being reported.
            print(f"{len(err.args[0])} log files moved while being kept", file=sys.stderr)
        print(f"Ray and engine logs kept in {logs_out}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--case", default="pd", choices=CASE_NAMES)
    parser.add_argument("--logs", type=Path, default=None, help="where to keep the logs of a failed run")
    parser.add_argument("--results", type=Path, default=None, help="where the P/D case writes its short bench")
    raw = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(raw)
    if os.environ.get(IN_NAMESPACE) != "1":
        return in_namespace(raw)
    return run(args.case, args.logs, args.results)


if __name__ == "__main__":
    sys.exit(main())
