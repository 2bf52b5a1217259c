"""target=llmd: llm-d model-service values that the chart's own schema takes, containers and volumes the Pod schema
takes, fields the chart's template reads, pods that run the commands the engines' own checks judged (every index of
a multi-host engine), Services the router reaches, and the router's llm-d protocol against stand-in sidecars."""

from __future__ import annotations

import asyncio
import gzip
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import ClientSession, web
from launched import releases
from test_router import Engines, free_port, post, run, running

from helpers import REPO

DATA = REPO / "tests" / "data"
PLANS = sorted((DATA / "plans").glob("*.json"))


@cache
def chart() -> tuple[Any, ...]:
    from deployment.crd import load_crd
    from deployment.helm_values import pod_schemas

    schema = json.loads(gzip.open(DATA / "llmd" / "values.schema.json.gz", "rt", encoding="utf-8").read())
    defaults = yaml.safe_load((DATA / "llmd" / "values.yaml").read_text())
    helpers = (DATA / "llmd" / "_helpers.tpl").read_text()
    pod = pod_schemas(load_crd(DATA / "crds" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml.gz"))
    return schema, defaults, helpers, pod


def llmd_options(engine: str) -> Any:
    """target=llmd's options for `engine`, each record at its defaults, as the launch folder writes with them."""
    from deployment.engines import adapter
    from deployment.options import DeployOptions
    from deployment.targets import target

    return adapter(engine).own(target("llmd").own(DeployOptions(engine=engine, target="llmd")))


def check(values: dict[str, Any]) -> list[str]:
    from deployment.helm_values import check as check_values

    return check_values(values, *chart())


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.stem)
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_every_engine_s_values_pass_the_chart_s_checks(path: Path, engine: str) -> None:
    import plan as plans
    from deployment.commands import engine_argv
    from deployment.deployable import engines
    from deployment.launch import ENGINE_PORT
    from deployment.targets.llmd import CONNECTORS, SIDECAR_PORT, values

    plan, opts = plans.load(path), llmd_options(engine)
    for e in engines(plan):
        v = values(plan, e, opts)
        assert check(v) == [], e.name
        pod = v[e.role]
        assert pod["create"] and not v["prefill" if e.role == "decode" else "decode"]["create"]
        assert v["multinode"] == (e.nnodes > 1) and pod["parallelism"]["workers"] == e.nnodes  # the LWS size
        # the chart asks the pod for tensor x dataLocal GPUs unless the container says: both say a host's share
        (c,) = pod["containers"]
        gpus = pod["parallelism"]["tensor"] * pod["parallelism"]["dataLocal"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == gpus == min(e.gpus, e.placement.node_gpus)
        argv = engine_argv(e, 0, plan, opts)
        assert argv[argv.index("--port") + 1] == str(ENGINE_PORT) == str(v["routing"]["proxy"]["targetPort"])
        assert v["routing"]["proxy"]["enabled"] == (e.role == "decode")  # the sidecar in front of decode engines
        assert v["routing"]["proxy"]["connector"] == CONNECTORS[engine]
        assert v["routing"]["proxy"]["secure"] is False  # the chart passes --secure-proxy=false: the router speaks HTTP
        (service,) = v["extraObjects"]
        ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
        assert ports["http"] == (SIDECAR_PORT if e.role == "decode" else ENGINE_PORT)
        assert ("bootstrap" in ports) == (engine == "sglang" and e.role == "prefill")
        assert service["spec"]["selector"].get("leaderworkerset.sigs.k8s.io/worker-index") == (
            "0" if e.nnodes > 1 else None
        )  # a multi-host engine's Service reaches its leader only


def test_the_upstream_examples_pass_and_each_kind_of_mistake_is_caught() -> None:
    """The checks take the chart's own examples, and catch each kind of mistake, naming where it is."""
    for sample in sorted((DATA / "llmd" / "samples").glob("*.yaml")):
        assert check(yaml.safe_load(sample.read_text())) == [], sample.name
    import plan as plans
    from deployment.deployable import engines
    from deployment.targets.llmd import values

    plan = plans.load(PLANS[0])
    e = next(e for e in engines(plan) if e.nnodes > 1)
    good = values(plan, e, llmd_options("vllm"))

    def broken(change: Any) -> list[str]:
        v = json.loads(json.dumps(good))
        change(v, v[e.role], v[e.role]["containers"][0])
        return check(v)

    cases = [
        (lambda v, p, c: v.update(multinode="yes"), "multinode: 'yes' is not of type 'boolean'"),
        (lambda v, p, c: v["routing"]["proxy"].update(zapEncoder="xml"), "routing.proxy.zapEncoder: 'xml' is not one"),
        (lambda v, p, c: v["modelArtifacts"].update(path="/m"), "modelArtifacts.path: unknown field"),
        (lambda v, p, c: p["parallelism"].update(tensor="8"), f"{e.role}.parallelism.tensor: '8' is not of type"),
        (lambda v, p, c: c.update(lifecycle={}), f"{e.role}.containers[0].lifecycle: the chart's template does not"),
        (lambda v, p, c: c.update(command="vllm serve"), f"{e.role}.containers[0].command: 'vllm serve' is not of"),
        (lambda v, p, c: c["extraConfig"].update(securityContext={"capabilities": {"add": "IPC_LOCK"}}),
         f"{e.role}.containers[0].securityContext.capabilities.add: 'IPC_LOCK' is not of type 'array'"),
        (lambda v, p, c: p["volumes"][1].update(hostpath={"path": "/m"}), f"{e.role}.volumes[1].hostpath: unknown"),
    ]  # fmt: skip
    for change, message in cases:
        errors = broken(change)
        assert any(message in err for err in errors), (message, errors)


def test_a_multi_host_engine_s_every_pod_runs_its_own_checked_command(tmp_path: Path) -> None:
    """The chart gives a LeaderWorkerSet one pod template: each index runs the leader's or a worker's command as the
    other targets do, host-known values filled from the pod (the engines' own checks judged those commands)."""
    import plan as plans
    from deployment.commands import command, engine_argv
    from deployment.deployable import engines
    from deployment.folder import write
    from deployment.launch import WORKER, example_argv, example_env

    path = DATA / "plans" / "table_5_1_hetero_a_azure_code.json"
    plan = plans.load(path)
    for engine in ("sglang", "vllm"):
        opts = llmd_options(engine)
        write(plan, opts, tmp_path / engine, str(path))
        deep = max(engines(plan), key=lambda e: e.nnodes)
        runs = {r.where: r for r in releases(tmp_path / engine, tmp_path, indices=tuple(range(1, deep.nnodes)))}
        checked = 0
        for e in engines(plan):
            if e.nnodes == 1:
                continue
            assert runs[f"{e.name} leader"].argv == engine_argv(e, 0, plan, opts)
            for i in range(1, e.nnodes):
                worker = command(e, WORKER, plan, opts)
                assert runs[f"{e.name} worker {i}"].argv == example_argv(worker, i), (e.name, i)
                for name, value in example_env(worker, i).items():
                    assert runs[f"{e.name} worker {i}"].env[name] == value
                checked += 1
        assert checked == sum(e.nnodes - 1 for e in engines(plan)) > 10


def test_the_folder_installs_every_engine_and_routes_through_the_decode_sidecars(tmp_path: Path) -> None:
    from helpers import in_process
    from pipeline.deploy import execute

    path = DATA / "plans" / "table_5_1_hetero_a_azure_code.json"
    out = tmp_path / "d"
    r = in_process(execute, "deploy", f"plan={path}", f"out={out}", "target=llmd")
    assert r.returncode == 0, r.stderr
    names = sorted(p.name.removesuffix(".values.yaml") for p in (out / "llmd").glob("*.values.yaml"))
    install = (out / "install.sh").read_text()
    assert len(names) == 14 and all(f"helm upgrade --install {n} llm-d-modelservice/" in install for n in names)
    assert "kubectl apply -f router.yaml" in install and (out / "install.sh").stat().st_mode & 0o111
    route = json.loads((out / "routing.json").read_text())
    assert route["protocol"] == "llmd"
    urls = {ph: [u for isl in route["islands"][ph].values() for u in isl["engines"]] for ph in ("prefill", "decode")}
    assert urls["decode"] == ["http://i01-decode-h20:8000"] and all(u.endswith(":30000") for u in urls["prefill"])
    # the router asks the decode engine itself for its health, not its sidecar
    assert route["health"] == {"http://i01-decode-h20:8000": "http://i01-decode-h20:30000"}
    import kubernetes_validate

    docs = list(yaml.safe_load_all((out / "router.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Deployment", "Service"]
    services = [o for n in names for o in yaml.safe_load((out / "llmd" / f"{n}.values.yaml").read_text())
                ["extraObjects"]]  # fmt: skip
    for d in docs + services:  # Kubernetes' own schemas, strict (unknown fields refused)
        kubernetes_validate.validate(d, "1.30", strict=True)
    assert json.loads(docs[0]["data"]["routing.json"]) == route
    readme = (out / "README.md").read_text()
    assert "./install.sh" in readme and "x-prefiller-host-port" in readme


def test_a_value_helm_would_run_as_a_template_is_refused(tmp_path: Path) -> None:
    """The chart renders a container's env as a Helm template; RDMA device names (its only free text) are checked."""
    import plan as plans
    from deployment.errors import DeployError
    from deployment.options import DeployOptions

    with pytest.raises(DeployError, match="ib_devices="):
        DeployOptions(engine="vllm", target="llmd", ib_devices="mlx5_0,{{ .Values }}")
    assert DeployOptions(engine="vllm", target="llmd", ib_devices="mlx5_0, mlx5_1").ib_devices
    # and whatever else a later setting puts where the chart renders templates is refused before it is written
    from deployment.deployable import engines
    from deployment.targets.llmd import _untemplated, values

    plan = plans.load(PLANS[0])
    e = engines(plan)[0]
    v = values(plan, e, llmd_options("sglang"))
    v[e.role]["containers"][0]["env"].append({"name": "X", "value": '{{ lookup "v1" "Secret" "" "" }}'})
    with pytest.raises(DeployError, match="Helm template"):
        _untemplated(e, v)


# --- the router's llm-d protocol -----------------------------------------------------------------------------------


class Sidecars:
    """Stand-in routing sidecars: each answers a completion naming itself and the prefill engine it was told."""

    def __init__(self) -> None:
        self.told: dict[int, list[str]] = {}
        self.runners: dict[int, web.AppRunner] = {}

    async def start(self) -> int:
        port = free_port()
        self.told[port] = []

        async def complete(request: web.Request) -> web.Response:
            self.told[port].append(request.headers.get("x-prefiller-host-port", ""))
            return web.json_response({"choices": [{"text": f"decoded at {port}"}]})

        async def health(request: web.Request) -> web.Response:
            return web.json_response({"ok": True})

        application = web.Application()
        application.router.add_post("/v1/completions", complete)
        application.router.add_get("/health", health)
        runner = web.AppRunner(application, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        self.runners[port] = runner
        return port

    async def kill(self, port: int) -> None:
        await self.runners.pop(port).cleanup()


def test_the_router_names_the_drawn_prefill_engine_to_a_decode_sidecar() -> None:
    """Fractions over two prefill islands reach the sidecars as the header; a prefill engine found down is no longer
    named; a decode engine found down behind a sidecar that still answers (routing.json's `health`) and a sidecar that
    is gone are both left for the other decode engine; a path the sidecar does not disaggregate is a 400."""

    async def main() -> None:
        engines, sidecars = Engines(), Sidecars()
        pre = [await engines.start(0.0) for _ in range(3)]
        dec = [await sidecars.start() for _ in range(3)]
        behind = [await engines.start(0.0) for _ in dec]  # the decode engines behind the sidecars
        urls = [f"http://127.0.0.1:{p}" for p in dec]
        config = {
            "protocol": "llmd",
            "islands": {
                "prefill": {"0": {"engines": [f"http://127.0.0.1:{pre[0]}"], "ranges": [[0, 100_000, 0.25]]},
                            "1": {"engines": [f"http://127.0.0.1:{p}" for p in pre[1:]],
                                  "ranges": [[0, 100_000, 0.75]]}},
                "decode": {"2": {"engines": urls, "ranges": [[0, 100_000, 1.0]]}},
            },
            "health": {u: f"http://127.0.0.1:{p}" for u, p in zip(urls, behind, strict=True)},
        }  # fmt: skip
        async with running(config, health_interval_s=0.2) as url, ClientSession() as s:
            for k in range(400):  # 400 conversations (the router keeps one on one prefill engine: its opening)
                status, body, _, _ = await post(s, url, {"prompt": f"hello {k}", "max_tokens": 4})
                assert status == 200 and body["choices"][0]["text"].startswith("decoded at"), body
            told = [h for port in dec for h in sidecars.told[port]]
            assert len(told) == 400 and set(told) <= {f"127.0.0.1:{p}" for p in pre}
            share0 = told.count(f"127.0.0.1:{pre[0]}") / len(told)
            assert 0.18 < share0 < 0.32, share0  # the plan's 25 % (binomial sd 2.2 %)
            engines.kill(pre[0])  # a prefill engine dies: the health check finds it within 0.2 s
            engines.kill(behind[0])  # decode engine 0 dies; its sidecar still answers
            await asyncio.sleep(0.6)
            for port in dec:
                sidecars.told[port].clear()
            await sidecars.kill(dec[1])  # sidecar 1 is gone: its requests go to the other
            for _ in range(50):
                status, body, _, _ = await post(s, url, {"prompt": "hello", "max_tokens": 4})
                assert status == 200, body
            assert len(sidecars.told[dec[2]]) == 50 and not sidecars.told[dec[0]]
            assert f"127.0.0.1:{pre[0]}" not in sidecars.told[dec[2]]
            async with s.post(url + "/generate", json={"text": "hello"}) as r:
                assert r.status == 400 and "/v1/completions and /v1/chat/completions" in (await r.json())["error"]
        for port in (dec[0], dec[2]):
            await sidecars.kill(port)

    run(main())


def test_a_health_table_that_names_no_engine_is_refused() -> None:
    from deployment.router.table import RoutingError, load

    good = {"protocol": "llmd", "islands": {
        "prefill": {"0": {"engines": ["http://p:30000"], "ranges": [[0, 10, 1.0]]}},
        "decode": {"1": {"engines": ["http://d:8000"], "ranges": [[0, 10, 1.0]]}}}}  # fmt: skip
    assert load({**good, "health": {"http://d:8000": "http://d:30000"}}).health == {"http://d:8000": "http://d:30000"}
    with pytest.raises(RoutingError, match=r"`health`: 'http://x:8000' is not an engine of `islands`"):
        load({**good, "health": {"http://x:8000": "http://d:30000"}})
    with pytest.raises(RoutingError, match=r"health\.http://d:8000: 'd:30000' is not an engine URL"):
        load({**good, "health": {"http://d:8000": "d:30000"}})
