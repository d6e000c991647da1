"""`redrafter-sim demo`: the whole lifecycle on this machine — no cluster, no GPU.

It starts a real Kubernetes control plane on loopback (:mod:`.controlplane`: etcd, kube-apiserver, the
controller manager and the scheduler), installs the CRD and applies the resource with the pinned kubectl, runs
the real operator as production does (``redrafter-operator run``) under the Helm chart's ServiceAccount and
RBAC, and a simulated node that speaks only the real API (:mod:`.node`): the pods Kubernetes' own Job and
ReplicaSet controllers create and its scheduler binds run there — build Jobs the real ``engine_jobs`` program
with the stand-in toolchain, serving pods real tritonservers with the simulated engine on 127.0.0.N. Traffic comes from the evaluate load generator, routed per request through the Service
(:mod:`.router`). A scenario (:mod:`.scenarios`) changes load and the simulated acceptance rate and
waits for the operator to react; the summary is built only from what the operator wrote (status,
status.history, Events). At the end one chat completion goes through the Service's ``openai`` port with
the official OpenAI client, as an application calls it, with the acceptance rate its response carries.
Exit 0 only if every stage happened and that completion succeeded. Ctrl-C stops everything it started and
removes its temp directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from engine_jobs.contract import ACCEPTANCE_HEADER, METRICS_PORT, OPENAI_PORT, SourceRef
from redrafter_operator.api import API_VERSION, KIND, PLURAL
from redrafter_operator.api.crd import crd_yaml
from redrafter_operator.api.spec import parse_spec
from redrafter_operator.evaluate.prompts import Prompt
from redrafter_operator.evaluate.stream import RequestOptions
from redrafter_operator.render import names
from redrafter_operator.render.build import named_sources, source_claims
from redrafter_operator.render.podsecurity import ENFORCE_LABEL, ENFORCE_VERSION_LABEL

from .buildjobs import provision_source
from .chartrbac import chart_rbac
from .controlplane import ControlPlane, write_yaml
from .engine import SimEngineSettings
from .kubeapi import EVENTS, PODS, PVCS, SECRETS, Kind, KubeApi
from .node import SimNode
from .nodes import dcgm_exporter
from .operator_process import OperatorProcess
from .prometheus import PrometheusServer, PrometheusUnavailable, ServingTarget, scrape_config, write_serving_file
from .router import NoEndpoints, ServiceRouter
from .scenarios import (
    DEFAULT_SCENARIO,
    FAST_FACTOR,
    SCENARIOS,
    Scenario,
    Stage,
    StageResult,
    all_hold,
    describe,
    load_scenario,
    lookup,
    with_training,
)
from .traffic import RoutedLoadGenerator, TrafficStats
from .triton import free_ports
from .view import DemoView, describe_chat, render_summary

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MANIFEST = ROOT / "examples" / "demo-tiny.yaml"
BIN = Path(sys.executable).parent
KUBECTL = BIN / "kubectl"
RDD = Kind(API_VERSION, PLURAL)
POLL_S = 0.5
MAX_TOKENS = 32
#: the simulated engine: a 10 ms step (so engine time, not Python overhead, sets the pace), drafting
#: numBeams x draftLenPerBeam tokens per step with the stage's target acceptance
SIM_ENGINE = SimEngineSettings(step_ms=10.0, load_factor=0.04, draft_ms_per_token=0.05)
#: the demo's chat request (the fake checkpoint's chat template renders it; see checkpoint.CHAT_TEMPLATE)
CHAT_MESSAGES = [{"role": "system", "content": "w20 w21"}, {"role": "user", "content": "w5 w6 w7 w8"}]
CHAT_MAX_TOKENS = 16

log = logging.getLogger("redrafter.demo")


class Interrupted(Exception):
    """Ctrl-C / SIGTERM."""


@dataclass
class DemoOptions:
    manifest: Path = DEFAULT_MANIFEST
    scenario: str = DEFAULT_SCENARIO
    fast: bool = False
    summary_json: Path | None = None
    keep_temp: bool = False
    prometheus: bool = False
    train: bool = False


#: what ``demo --train`` trains the drafter on: prompts the node writes in the tiny model's words, and a recipe
#: sized for this CPU (the API's defaults are the paper's, for GPUs)
DEMO_TRAINING: dict[str, Any] = {
    "dataset": {"source": "pvc://datasets/prompts.jsonl"},
    "samples": 64,
    # a higher learning rate than the paper's: the head has 100 steps, not an epoch over 20000 prompts
    "recipe": {
        "responseLen": 32,
        "epochs": 10,
        "maxSteps": 100,
        "batchSize": 8,
        "learningRate": 0.01,
        "heldOutFraction": 0.1,
    },
}


def with_drafter_training(resource: dict[str, Any]) -> dict[str, Any]:
    """The resource with only its base model: the operator trains the drafter (``demo --train``)."""
    out = copy.deepcopy(resource)
    out["spec"]["model"]["drafter"] = {"train": copy.deepcopy(DEMO_TRAINING)}
    return out


# ---------------------------------------------------------------------------- processes
async def kubectl(kubeconfig: Path, tmp: Path, *args: str, stdin: str | None = None) -> str:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp)}
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL),
        "--kubeconfig",
        str(kubeconfig),
        "--cache-dir",
        str(tmp / "kubectl-cache"),
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {err.decode().strip()}")
    return out.decode()


# ---------------------------------------------------------------------------- the run
def load_resource(path: Path) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    found = [d for d in docs if d.get("kind") == KIND]
    if len(found) != 1:
        raise ValueError(f"{path} must contain exactly one {KIND} (found {len(found)})")
    body = found[0]
    body.setdefault("metadata", {}).setdefault("namespace", "default")
    return body


def restricted_namespace(name: str) -> dict[str, Any]:
    """The Namespace labelled so the API server's PodSecurity admission enforces ``restricted``."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {ENFORCE_LABEL: "restricted", ENFORCE_VERSION_LABEL: "latest"},
        },
    }


def demo_prompts(n: int = 16) -> list[Prompt]:
    """Prompts in the fake checkpoint's vocabulary ("w<id>" words), distinct per request slot."""
    return [Prompt(" ".join(f"w{3 + (i * 37 + j * 11) % 990}" for j in range(12))) for i in range(n)]


class DemoRun:
    def __init__(self, opts: DemoOptions, scenario: Scenario, resource: dict[str, Any], tmp: Path) -> None:
        self.opts = opts
        self.scenario = scenario
        self.resource = resource
        self.name = resource["metadata"]["name"]
        self.namespace = resource["metadata"]["namespace"]
        self.tmp = tmp
        self.stop_event = asyncio.Event()
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self.results: list[StageResult] = []
        self.current: Stage | None = None
        self.obj: dict[str, Any] | None = None
        self.stats = TrafficStats(window_s=4.0)
        self.view = DemoView(scenario, self)
        self.api: KubeApi | None = None
        self.node: SimNode | None = None
        self.loadgen: RoutedLoadGenerator | None = None
        self.operator: OperatorProcess | None = None
        self.prometheus: PrometheusServer | None = None
        self.events: list[dict[str, Any]] = []
        #: status.drafter as it changed while the demo watched (``--train``): its progress, then its result
        self.drafter_seen: list[dict[str, Any]] = []
        self.chat: dict[str, Any] = {"error": "not attempted"}
        #: what `redrafter-operator check` printed before the resource was applied
        self.check_lines: list[str] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    async def run(self) -> dict[str, Any]:
        kubeconfig = self.tmp / "kubeconfig"
        cp = ControlPlane(self.tmp / "controlplane")
        loadgen_task: asyncio.Task[Any] | None = None
        prometheus_task: asyncio.Task[Any] | None = None
        try:
            await asyncio.to_thread(cp.start)
            write_yaml(kubeconfig, cp.kubeconfig(cp.admin, namespace=self.namespace))
            self.view.note(
                f"Kubernetes control plane on {cp.url} (etcd, kube-apiserver, controller manager, scheduler)"
            )
            await kubectl(kubeconfig, self.tmp, "apply", "--server-side", "-f", "-", stdin=crd_yaml())
            await asyncio.to_thread(cp.wait_established, f"{PLURAL}.{API_VERSION.split('/')[0]}")
            # as a hardened cluster would: Pods that do not meet the restricted profile are rejected
            await kubectl(
                kubeconfig, self.tmp, "apply", "-f", "-", stdin=yaml.safe_dump(restricted_namespace(self.namespace))
            )
            self.view.note(f"namespace {self.namespace} enforces Pod Security restricted")
            operator_config = await self._operator_identity(cp, kubeconfig)
            metrics_port = free_ports("127.0.0.1", 1)[0] if self.opts.prometheus else None
            liveness = f"http://127.0.0.1:{free_ports('127.0.0.1', 1)[0]}/healthz"
            args = ["--standalone", "--resync-seconds", "30", "--liveness", liveness]
            if metrics_port is not None:
                args += ["--metrics-port", str(metrics_port)]
            self.operator = OperatorProcess(operator_config, self.namespace, self.tmp / "operator.log", args)
            await self.operator.start()
            self.view.note("operator started under the chart's ServiceAccount: " + " ".join(self.operator.argv[1:3]))
            node_config = cp.node_kubeconfig("sim-node-0")
            proxy_config = cp.write_kubeconfig(self.tmp / "kube-proxy.kubeconfig", "system:kube-proxy")
            async with (
                KubeApi.from_kubeconfig(kubeconfig) as api,
                SimNode(
                    node_config,
                    proxy_kubeconfig=proxy_config,
                    sim=SIM_ENGINE,
                    node_dir=self.tmp / "node",
                    openai_front=True,
                ) as node,
            ):
                self.api, self.node = api, node
                await self._check(node, kubeconfig, liveness)
                if metrics_port is not None:
                    prometheus_task = asyncio.create_task(self._prometheus(api, metrics_port), name="prometheus")
                if self.opts.train:  # training loads the base's weights: a real (tiny, random) Llama
                    base = SourceRef(uri=self.resource["spec"]["model"]["base"]["source"])
                    # into the claim's PersistentVolume, where the pods read it (before any build pod's fixture)
                    claim = base.uri.removeprefix("pvc://").partition("/")[0]
                    volumes = {claim: node.claim_path(self.namespace, claim)}
                    await asyncio.to_thread(provision_source, node.fs, base, "trainable-base", volumes)
                first = self.scenario.stages[0]
                if first.acceptance is not None:
                    node.set_engine(self.namespace, self.name, "redrafter", acceptance_rate=first.acceptance)
                await kubectl(
                    kubeconfig, self.tmp, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(self.resource)
                )
                self.view.note(f"kubectl apply {KIND}/{self.name}")
                async with ServiceRouter(api, self.namespace, names.service_name(self.name)) as router:
                    # fixed-length requests (min_tokens) where the engine has them: the PyTorch backend's
                    # llmapi model has not
                    fixed = self.resource["spec"].get("method", "redrafter") == "redrafter"
                    self.loadgen = RoutedLoadGenerator(
                        router,
                        demo_prompts(),
                        RequestOptions(max_tokens=MAX_TOKENS, fixed_length=fixed),
                        stats=self.stats,
                    )
                    loadgen_task = asyncio.create_task(self.loadgen.run(), name="loadgen")
                    with self.view.live():
                        await self._stages()
                    if self.results and all(r.happened for r in self.results):
                        self.chat = await self._chat_completion(api)
                        self.view.note(describe_chat(self.chat))
                    self.loadgen.stop(cancel_in_flight=True)
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(loadgen_task, 15)
                    self.events = await self._events()
                    self.obj = await api.get(RDD, self.name, self.namespace) or self.obj
        finally:
            if self.loadgen is not None:
                self.loadgen.stop(cancel_in_flight=True)
            if loadgen_task is not None and not loadgen_task.done():
                loadgen_task.cancel()
                await asyncio.gather(loadgen_task, return_exceptions=True)
            if prometheus_task is not None:
                prometheus_task.cancel()
                await asyncio.gather(prometheus_task, return_exceptions=True)
            if self.prometheus is not None:
                await asyncio.to_thread(self.prometheus.stop)
            operator_tail = self.operator.log_tail() if self.operator else ""
            if self.operator is not None:
                await self.operator.stop()
            await asyncio.to_thread(cp.stop)
        return self.summary(operator_tail)

    async def _operator_identity(self, cp: ControlPlane, kubeconfig: Path) -> Path:
        """The chart's ServiceAccount and RBAC (release ``redrafter`` in ``redrafter-system``, as the README's
        ``helm install``), and a kubeconfig with a bound token of it for the operator process."""
        system = "redrafter-system"
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": system}}
        rbac, account = chart_rbac("redrafter", system)
        await kubectl(
            kubeconfig, self.tmp, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all([namespace, *rbac])
        )
        path = self.tmp / "operator.kubeconfig"
        await asyncio.to_thread(cp.service_account_kubeconfig, path, system, account)
        config = yaml.safe_load(path.read_text())
        config["contexts"][0]["context"]["namespace"] = self.namespace
        return write_yaml(path, config)

    async def _check(self, node: SimNode, kubeconfig: Path, liveness: str) -> None:
        """`redrafter-operator check` of the resource before it is applied, as a user would run it. The
        cluster's storage and GPU Operator are what a real one shows: the claims the resource names (Bound to
        PersistentVolumes the node's directories back) and the DCGM exporter beside the GPU nodes. The operator
        runs here, not in the cluster: --operator-health points the check at its liveness endpoint."""
        spec, _ = parse_spec(self.resource["spec"])
        assert spec is not None
        claims = list(dict.fromkeys([spec.engine.cache.claim_name, *source_claims(named_sources(spec))]))
        storage: list[dict[str, Any]] = []
        for claim in claims:
            storage.extend(node.claim_objects(self.namespace, claim))
        await kubectl(
            kubeconfig,
            self.tmp,
            "apply",
            "--server-side",
            "-f",
            "-",
            stdin=yaml.safe_dump_all(storage + dcgm_exporter()),
        )
        await self._bound(claims)
        deadline = time.monotonic() + 60  # kopf serves its liveness endpoint once the operator has started
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while time.monotonic() < deadline:
                with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                    async with session.get(liveness) as resp:
                        if resp.status == 200:
                            break
                if self.operator is not None and not self.operator.alive():
                    break
                await asyncio.sleep(0.2)
        manifest = self.tmp / "resource.yaml"
        manifest.write_text(yaml.safe_dump(self.resource))
        proc = await asyncio.create_subprocess_exec(
            str(BIN / "redrafter-operator"),
            "check",
            "-f",
            str(manifest),
            "--kubeconfig",
            str(kubeconfig),
            "--operator-health",
            liveness,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
        self.check_lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
        for line in self.check_lines:
            self.view.note(f"check: {line}")

    async def _bound(self, claims: list[str], timeout: float = 60.0) -> None:
        """Until the PersistentVolume binder has bound each claim to its volume, as a cluster's storage shows
        provisioned claims before anyone runs the check."""
        assert self.api is not None
        deadline = time.monotonic() + timeout
        for claim in claims:
            while ((await self.api.get(PVCS, claim, self.namespace) or {}).get("status") or {}).get("phase") != "Bound":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"PersistentVolumeClaim {self.namespace}/{claim} not Bound after {timeout:.0f}s")
                await asyncio.sleep(0.2)

    async def _prometheus(self, api: KubeApi, operator_port: int) -> None:
        """A real Prometheus scraping the operator and every serving pod (the list follows the API's Pods),
        as the chart's ServiceMonitor and PodMonitor would; the dashboard's queries run against it."""
        targets = self.tmp / "prometheus" / "serving.json"
        targets.parent.mkdir(parents=True, exist_ok=True)
        write_serving_file(targets, [])
        self.prometheus = PrometheusServer(
            scrape_config([], [f"127.0.0.1:{operator_port}"], serving_file=targets), workdir=self.tmp / "prometheus"
        )
        try:
            await asyncio.to_thread(self.prometheus.start)
        except (PrometheusUnavailable, RuntimeError) as exc:
            self.view.note(f"no Prometheus: {exc}".splitlines()[0])
            return
        self.view.note(f"Prometheus on {self.prometheus.url} (queries: charts/redrafter-operator/dashboards/)")
        print(
            f"Prometheus: {self.prometheus.url}/graph  (namespace={self.namespace}, deployment={self.name})",
            file=sys.stderr,
            flush=True,
        )
        selector = names.selector_string({names.LABEL_COMPONENT: "serving"})
        listed: list[ServingTarget] = []
        while True:
            with contextlib.suppress(Exception):  # the API server is going away at the end: keep the last list
                pods = await api.list(PODS, self.namespace, label_selector=selector)
                now = [
                    ServingTarget(
                        f"{ip}:{METRICS_PORT}", self.namespace, p["metadata"]["name"], front=f"{ip}:{OPENAI_PORT}"
                    )
                    for p in pods
                    if (ip := (p.get("status") or {}).get("podIP"))
                ]
                if now != listed:
                    write_serving_file(targets, now)
                    listed = now
            await asyncio.sleep(1.0)

    # -------------------------------------------------------------------------- stages
    async def _stages(self) -> None:
        for stage in self.scenario.stages:
            result = await self._stage(stage)
            self.results.append(result)
            self.view.stage_done(result)
            if not result.happened:
                break

    async def _stage(self, stage: Stage) -> StageResult:
        assert self.node is not None and self.loadgen is not None
        self.current = stage
        res = StageResult(
            stage.name,
            stage.description,
            stage.expect,
            describe(stage.until),
            started_s=self.elapsed(),
            wall_start=time.time(),
        )
        if stage.concurrency is not None:
            self.loadgen.set_concurrency(stage.concurrency)
        if stage.acceptance is not None:
            self.node.set_engine(self.namespace, self.name, "redrafter", acceptance_rate=stage.acceptance)
        start = time.monotonic()
        timeout = stage.timeout_s if stage.until else stage.min_s
        while True:
            if self.stop_event.is_set():
                raise Interrupted()
            await self._observe()
            waited = time.monotonic() - start
            broken = [c for c in stage.hold if self.obj is not None and not c.holds(self.obj)]
            if broken:
                res.failure = "; ".join(f"{c} broke ({c.path} = {lookup(self.obj, c.path)!r})" for c in broken)
                break
            met = all_hold(stage.until, self.obj)
            if met and waited >= stage.min_s:
                res.happened = True
                break
            if waited >= max(timeout, stage.min_s) and not met:
                res.failure = f"timed out after {timeout:.0f}s waiting for {describe(stage.until)}"
                break
            if self.operator is not None and not self.operator.alive():
                res.failure = "the operator process exited"
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), POLL_S)
        res.duration_s = time.monotonic() - start
        res.wall_end = time.time()
        status = (self.obj or {}).get("status") or {}
        res.observed = {c.path: lookup(self.obj, c.path) for c in stage.until}
        res.speculation = dict(status.get("speculation") or {})
        res.replicas = dict(status.get("serving") or {})
        res.traffic = {k: v for k, v in self.stats.window().items() if k != "by_pod"}
        return res

    async def _observe(self) -> None:
        assert self.api is not None
        with contextlib.suppress(Exception):
            self.obj = await self.api.get(RDD, self.name, self.namespace)
        drafter = ((self.obj or {}).get("status") or {}).get("drafter")
        if drafter:
            seen = {k: drafter.get(k) for k in ("state", "phase", "step", "totalSteps", "loss", "heldOutAcceptance")}
            if not self.drafter_seen or self.drafter_seen[-1] != seen:
                self.drafter_seen.append(seen)
        self.view.update()

    async def _events(self) -> list[dict[str, Any]]:
        assert self.api is not None
        out = []
        for ev in await self.api.list(EVENTS, self.namespace):
            inv = ev.get("involvedObject") or ev.get("regarding") or {}
            if inv.get("kind") == KIND and inv.get("name") == self.name:
                out.append(
                    {
                        "time": ev.get("lastTimestamp")
                        or ev.get("eventTime")
                        or ev.get("firstTimestamp")
                        or ev.get("metadata", {}).get("creationTimestamp"),
                        "type": ev.get("type", ""),
                        "reason": ev.get("reason", ""),
                        "message": ev.get("message") or ev.get("note") or "",
                        "count": ev.get("count", 1),
                    }
                )
        return sorted(out, key=lambda e: e["time"] or "")

    async def _api_key(self, api: KubeApi) -> str | None:
        """With spec.serving.auth.apiKeysSecret, the Secret's first key by entry name (as the validation
        Job picks it), as an application holding the key would send it; None without one."""
        import base64

        spec = (self.obj or self.resource).get("spec") or {}
        secret = ((spec.get("serving") or {}).get("auth") or {}).get("apiKeysSecret")
        if not secret:
            return None
        obj = await api.get(SECRETS, secret, self.namespace)
        data = {k: base64.b64decode(v).decode().strip() for k, v in ((obj or {}).get("data") or {}).items()}
        data |= {k: v.strip() for k, v in ((obj or {}).get("stringData") or {}).items()}
        keys = [data[k] for k in sorted(data) if data[k]]
        if not keys:
            raise LookupError(f"secret {secret!r} (spec.serving.auth.apiKeysSecret) holds no API key")
        return keys[0]

    async def _chat_completion(self, api: KubeApi) -> dict[str, Any]:
        """One chat completion through the Service's ``openai`` port with the official client."""
        from openai import APIError, AsyncOpenAI

        service = names.service_name(self.name)
        out: dict[str, Any] = {"service": f"{service}:{OPENAI_PORT}", "error": None}
        async with ServiceRouter(api, self.namespace, service, port_name="openai", default_port=OPENAI_PORT) as router:
            try:
                backend = router.pick()
            except NoEndpoints as exc:
                return out | {"error": str(exc)}
        out["pod"] = backend.pod
        try:
            api_key = await self._api_key(api)
        except LookupError as exc:
            return out | {"error": str(exc)}
        async with AsyncOpenAI(
            base_url=f"http://{backend.url}/v1", api_key=api_key or "unused", max_retries=0, timeout=60
        ) as client:
            try:
                model = (await client.models.list()).data[0].id
                raw = await client.chat.completions.with_raw_response.create(
                    model=model, messages=CHAT_MESSAGES, max_tokens=CHAT_MAX_TOKENS
                )
            except (APIError, IndexError) as exc:
                return out | {"error": f"{type(exc).__name__}: {exc}"}
        done = raw.parse()
        rate = raw.headers.get(ACCEPTANCE_HEADER)
        return out | {
            "model": model,
            "content": done.choices[0].message.content,
            "finish_reason": done.choices[0].finish_reason,
            "usage": done.usage.model_dump(),
            "acceptance_rate": float(rate) if rate is not None else None,
        }

    # -------------------------------------------------------------------------- summary
    def summary(self, operator_tail: str) -> dict[str, Any]:
        status = (self.obj or {}).get("status") or {}
        history = list(status.get("history") or [])
        for res in self.results:
            res.decisions = [e for e in self.events if _within(e["time"], res.wall_start, res.wall_end)]
        stages = [s.__dict__ | {"decisions": s.decisions} for s in self.results]
        missing = [s.name for s in self.scenario.stages[len(self.results) :]]
        ok = bool(self.results) and all(r.happened for r in self.results) and not missing and not self.chat["error"]
        return {
            "scenario": self.scenario.name,
            "resource": f"{self.namespace}/{self.name}",
            "fast": self.opts.fast,
            "ok": ok,
            "wall_s": round(self.elapsed(), 1),
            "stages": [{k: v for k, v in s.items() if k not in ("wall_start", "wall_end")} for s in stages],
            "not_reached": missing,
            "check": self.check_lines,
            "history": history,
            "events": self.events,
            "final_status": {
                k: status.get(k)
                for k in (
                    "phase",
                    "activeEngine",
                    "serving",
                    "speculation",
                    "engines",
                    "drafter",
                    "validation",
                    "conditions",
                )
            },
            "drafter_progress": self.drafter_seen,
            "openai_chat": self.chat,
            "traffic": {
                "requests": self.stats.total_requests,
                "errors": self.stats.total_errors,
                "tokens": self.stats.total_tokens,
                "last_error": self.stats.last_error,
            },
            "operator_log_tail": "" if ok else operator_tail,
        }


def _within(stamp: str | None, start: float, end: float) -> bool:
    if not stamp:
        return False
    import datetime

    try:
        t = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return False
    return start - 1.0 <= t <= end + 1.0  # Event times have one-second resolution


async def run_demo(opts: DemoOptions) -> int:
    scenario = load_scenario(opts.scenario)
    if opts.fast:
        scenario = scenario.scaled(FAST_FACTOR)
    resource = load_resource(opts.manifest)
    if opts.train:
        scenario, resource = with_training(scenario), with_drafter_training(resource)
    tmp = Path(tempfile.mkdtemp(prefix="redrafter-demo-"))
    logging.basicConfig(
        filename=tmp / "demo.log",
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        force=True,
    )
    run = DemoRun(opts, scenario, resource, tmp)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, run.stop_event.set)
    interrupted = False
    summary: dict[str, Any] | None = None
    try:
        summary = await run.run()
    except Interrupted:
        interrupted = True
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        logging.shutdown()
        if opts.keep_temp:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if interrupted or summary is None:
        print("demo interrupted: every process stopped, temp files removed", file=sys.stderr)
        return 130
    render_summary(summary, run.view.console)
    if opts.summary_json:
        opts.summary_json.write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
    return 0 if summary["ok"] else 1


# ---------------------------------------------------------------------------- CLI
def _cmd_demo(args: argparse.Namespace) -> int:
    opts = DemoOptions(
        manifest=Path(args.file),
        scenario=args.scenario,
        fast=args.fast,
        summary_json=Path(args.summary_json) if args.summary_json else None,
        keep_temp=args.keep_temp,
        prometheus=args.prometheus,
        train=args.train,
    )
    try:
        load_scenario(opts.scenario)
        load_resource(opts.manifest)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(run_demo(opts))


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="the whole lifecycle on this machine: a real control plane, a simulated node, the real operator, "
        "real Triton with a simulated engine",
    )
    p.add_argument(
        "-f",
        "--file",
        default=str(DEFAULT_MANIFEST),
        help="ReDrafterDeployment manifest (default: examples/demo-tiny.yaml)",
    )
    p.add_argument(
        "--scenario",
        default=DEFAULT_SCENARIO,
        metavar="NAME|FILE",
        help="; ".join(f"{s.name}: {s.description}" for s in SCENARIOS.values())
        + "; or a YAML file of stages (see sim/redrafter_sim/scenarios.py)",
    )
    p.add_argument("--fast", action="store_true", help=f"shorten every stage's minimum duration x{FAST_FACTOR}")
    p.add_argument(
        "--train",
        action="store_true",
        help="start from the base model only: the operator trains the drafter first (a real tiny Llama, "
        "trained on this CPU; see docs/drafter.md)",
    )
    p.add_argument("--summary-json", metavar="PATH", help="also write the summary as JSON")
    p.add_argument("--keep-temp", action="store_true", help="keep the temp dir (logs, engine cache) for debugging")
    p.add_argument(
        "--prometheus",
        action="store_true",
        help="also run a real Prometheus (Debian package `prometheus`) scraping the operator and the "
        "serving pods, with the chart's alert rules; prints its URL for the dashboard's queries",
    )
    p.set_defaults(func=_cmd_demo)
