"""Launch files (deployment/, `python -m pipeline.deploy`): node-aligned islands, commands validated against the
engines' and Kubernetes' own definitions, and the router (deployment/router) over real HTTP on loopback against
stand-in engines."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from launched import ran

import plan as plans
from helpers import REPO, in_process, island, one_line, plan_of

CRDS = REPO / "tests" / "data" / "crds"


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path, _ = plan_of(tmp_path_factory.mktemp("plan"))
    return path


def deploy(plan: Path, out: Path, *args: str) -> Any:
    """`python -m pipeline.deploy plan=... out=... args`, in this process."""
    from pipeline.deploy import execute

    r = in_process(execute, "deploy", f"plan={plan}", f"out={out}", *args)
    assert r.returncode == 0, r.stderr
    return r


def test_every_island_sits_on_whole_hosts_or_inside_one(plan_path: Path) -> None:
    plan = plans.load(plan_path)
    used: Counter[tuple[str, int]] = Counter()
    for isl in plan.islands:
        assert isl.hosts is not None and isl.hosts.node_gpus == 8  # HGX H200 / H800 / H20 (conf/gpu node_gpus)
        assert isl.size % 8 == 0 or 8 % isl.size == 0, isl
        for h in isl.hosts.nodes:
            used[(isl.gpu, h)] += min(isl.size, 8)
        if isl.serving:  # engines hold their experts evenly: (E + r) divides over the EP group
            assert (256 + isl.redundant_experts) % isl.ep_group == 0
            assert (256 + isl.redundant_experts) // isl.ep_group == isl.experts_per_gpu
            assert 0 < isl.traffic_share <= 1 and 0 < isl.utilisation < 1
    assert max(used.values()) <= 8  # no host holds more GPUs than it has
    shares: Counter[str] = Counter()
    for isl in plan.serving:
        shares[isl.role] += isl.traffic_share
    assert shares["prefill"] == pytest.approx(1.0) and shares["decode"] == pytest.approx(1.0)


def launched(out: Path, target: str, tmp: Path) -> list[list[str]]:
    """Every engine command line of a deployment folder as the engine receives it: each host script run by bash,
    each container's command as the kubelet runs it (tests/launched.py)."""
    return [r.argv for r in ran(out, target, tmp)]


@pytest.mark.parametrize("target", ["shell", "k8s", "llmd"])
def test_sglang_commands_parse_with_sglangs_own_argument_definitions(
    plan_path: Path, tmp_path: Path, target: str
) -> None:
    from deployment.engines.base import EngineArgsMissing
    from deployment.engines.sglang.args import check_sglang

    deploy(plan_path, tmp_path / "d", f"target={target}")
    lines = launched(tmp_path / "d", target, tmp_path)
    assert lines
    try:
        check_sglang(["--model-path", "m"])
    except EngineArgsMissing as err:
        pytest.skip(str(err))
    decode = [i for i in plans.load(plan_path).islands if i.role == "decode"]
    for argv in lines:
        assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
        ns = check_sglang(argv[3:])
        assert ns.disaggregation_mode in ("prefill", "decode") and ns.tp_size == ns.ep_size
        if ns.disaggregation_mode == "decode":  # a decode island's batch per attention rank, over all its ranks
            assert ns.max_running_requests in {i.batch * i.ep // i.tp for i in decode if i.ep == ns.ep_size}
    # the check is strict: a renamed flag, a dropped choice or a deprecated spelling fails
    for bad in (["--tp-sizes", "4"], ["--moe-a2a-backend", "deepepx"], ["--enable-dp-attention"]):
        with pytest.raises(ValueError):
            check_sglang(["--model-path", "m", *bad])


def test_a_cap_on_running_requests_is_what_the_decode_engines_launch_with(tmp_path: Path) -> None:
    """Planned under `costmodel.max_running_requests=16`, every decode island's engine runs at most 16 requests (its
    batch a rank over its ranks), plan.json records the cap, and SGLang's own resolution of each decode engine's
    command reads back the planned count, at most the cap."""
    from deployment.engines.base import EngineArgsMissing
    from deployment.engines.sglang.args import check_sglang

    path, _ = plan_of(tmp_path, "costmodel.max_running_requests=16")
    plan = plans.load(path)
    decode = [i for i in plan.islands if i.role == "decode"]
    assert decode and plan.cost.engine.max_running_requests == 16
    assert all(0 < i.batch * i.ep // i.tp <= 16 for i in decode)
    deploy(path, tmp_path / "d", "target=shell")
    try:
        check_sglang(["--model-path", "m"])
    except EngineArgsMissing as err:
        pytest.skip(str(err))
    running = [check_sglang(argv[3:]).max_running_requests for argv in launched(tmp_path / "d", "shell", tmp_path)
               if "decode" in argv]  # fmt: skip
    assert running and all(0 < r <= 16 for r in running)
    assert set(running) <= {i.batch * i.ep // i.tp for i in decode}


@pytest.mark.parametrize("target", ["shell", "k8s", "llmd"])
def test_vllm_commands_parse_with_vllms_own_argument_definitions(plan_path: Path, tmp_path: Path, target: str) -> None:
    from deployment.engines.vllm.args import check_vllm, vllm_source

    deploy(plan_path, tmp_path / "d", "engine=vllm", f"target={target}")
    lines = launched(tmp_path / "d", target, tmp_path)
    assert lines
    root = vllm_source()  # vLLM's pinned sdist from PyPI (cached): its arg_utils.py and config classes
    groups = {(i.role, i.ep_group, i.redundant_experts) for i in plans.load(plan_path).serving}
    for argv in lines:
        assert argv[:2] == ["vllm", "serve"]
        ns = check_vllm(argv[2:], root)
        assert ns.enable_expert_parallel and ns.kv_transfer_config["kv_connector"] == "NixlConnector"
        role = "decode" if ns.max_num_seqs else "prefill"  # an island of the plan, its experts held as planned
        redundant = (ns.eplb_config or {}).get("num_redundant_experts", 0)
        assert (role, ns.tensor_parallel_size * ns.data_parallel_size, redundant) in groups
        assert bool(ns.enable_eplb) == (redundant > 0)
        if ns.headless:  # a secondary host: it joins its leader's data parallel group at its first rank
            assert ns.data_parallel_address and ns.data_parallel_start_rank is not None
    # strict: a renamed flag, an unknown KV role, a misspelt EPLB field or an out-of-range size fails
    for bad in (["--tp", "4"], ["--kv-transfer-config", '{"kv_connector": "NixlConnector", "kv_role": "both"}'],
                ["--eplb-config", '{"num_redundant": 8}'], ["--tensor-parallel-size", "0"]):  # fmt: skip
        with pytest.raises(ValueError):
            check_vllm(["m", *bad], root)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_manifests_validate_against_the_kubernetes_schemas(plan_path: Path, tmp_path: Path, engine: str) -> None:
    import kubernetes_validate

    from deployment.crd import load_crd, validate

    lws = load_crd(CRDS / "leaderworkerset.x-k8s.io_leaderworkersets.yaml.gz")
    deploy(plan_path, tmp_path / "k", "target=k8s", f"engine={engine}")
    docs = list(yaml.safe_load_all((tmp_path / "k" / "manifests.yaml").read_text()))
    kinds = Counter(d["kind"] for d in docs)
    from plan import engines_of

    hosts = Counter(e.nnodes > 1 for e in engines_of(plans.load(plan_path)))  # a multi-host engine is a LeaderWorkerSet
    assert kinds["LeaderWorkerSet"] == hosts[True] >= 1 and kinds["ConfigMap"] == 1
    assert kinds["Deployment"] == hosts[False] + 1  # each single-host engine's, and the router's
    for d in docs:
        if d["kind"] != "LeaderWorkerSet":
            kubernetes_validate.validate(d, "1.30", strict=True)
            continue
        # the LeaderWorkerSet CRD's own OpenAPI schema (tests/data/crds, pinned), and its pod templates as core
        # PodTemplates of the Kubernetes schemas
        assert validate(d, lws) == []
        lwt = d["spec"]["leaderWorkerTemplate"]
        assert lwt["size"] >= 2
        for name in ("leaderTemplate", "workerTemplate"):
            tmpl = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": d["metadata"]["name"]},
                    "template": lwt[name]}  # fmt: skip
            kubernetes_validate.validate(tmpl, "1.30", strict=True)
    route = json.loads(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["routing.json"])
    assert route["protocol"] == engine


# --- the router over real HTTP --------------------------------------------------------------------


def routing_config(protocol: str, ports: dict[str, int]) -> dict[str, Any]:
    """Two prefill islands splitting the short range 3:1 and owning one long range each; one decode island."""
    url = {k: f"http://127.0.0.1:{p}" for k, p in ports.items()}
    return {
        "protocol": protocol,
        "bootstrap_port": 8998,
        "chars_per_token": 4.0,
        "islands": {
            "prefill": {
                "1": {"engines": [url["p1"]], "ranges": [[0, 1000, 0.75], [1000, 2000, 1.0]]},
                "2": {"engines": [url["p2"]], "ranges": [[0, 1000, 0.25], [2000, 8000, 1.0]]},
            },
            "decode": {"0": {"engines": [url["d"]], "ranges": [[0, 1000, 1.0], [1000, 2000, 1.0], [2000, 8000, 1.0]]}},
        },
    }


async def _exercise(protocol: str) -> tuple[dict[str, list[dict[str, Any]]], list[tuple[int, str, str]]]:
    from aiohttp import ClientSession, web

    from deployment.router import app

    seen: dict[str, list[dict[str, Any]]] = {"p1": [], "p2": [], "d": []}

    def engine(name: str) -> web.Application:
        async def handle(request: web.Request) -> web.Response:
            body = await request.json()
            seen[name].append(body)
            out: dict[str, Any] = {"choices": [{"text": f"from {name}"}]}
            if name != "d" and protocol == "vllm":
                out["kv_transfer_params"] = {"remote_engine": name}
            return web.json_response(out)

        async def health(request: web.Request) -> web.Response:
            return web.json_response({})

        a = web.Application()
        a.router.add_post("/v1/completions", handle)
        a.router.add_get("/health", health)
        return a

    runners, ports = [], {}
    for name in seen:
        runner = web.AppRunner(engine(name))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        ports[name] = runner.addresses[0][1]
    router = web.AppRunner(app(routing_config(protocol, ports), seed=0))
    await router.setup()
    await web.TCPSite(router, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{router.addresses[0][1]}"
    answers = []
    async with ClientSession() as s:
        for k in range(240):
            tokens = (500, 1500, 4000)[k % 3]
            prompt = [2 + k] + [1] * (tokens - 1)  # 240 conversations: each opening its own (the router's session key)
            async with s.post(f"{base}/v1/completions", json={"prompt": prompt, "max_tokens": 8}) as r:
                assert r.status == 200
                answers.append((tokens, r.headers["X-Archipelago-Prefill"], (await r.json())["choices"][0]["text"]))
    for r in [router, *runners]:
        await r.cleanup()
    return seen, answers


@pytest.mark.parametrize("protocol", ["sglang", "vllm"])
def test_the_router_applies_the_plans_length_routing_over_http(protocol: str) -> None:
    seen, answers = asyncio.run(_exercise(protocol))
    by_len: dict[int, Counter[str]] = {}
    for tokens, pre, text in answers:
        assert text == "from d"  # the client gets the decode engine's answer
        by_len.setdefault(tokens, Counter())[pre] += 1
    # 1,500 tokens only on island 1, 4,000 only on island 2, 500 split 3:1 (80 draws)
    assert len(by_len[1500]) == 1 and len(by_len[4000]) == 1 and by_len[1500] != by_len[4000]
    short = by_len[500]
    p1 = next(iter(by_len[1500]))
    assert 0.6 <= short[p1] / 80 <= 0.9
    assert len(seen["d"]) == 240
    if protocol == "sglang":  # both engines get the request, with one bootstrap room
        assert len(seen["p1"]) + len(seen["p2"]) == 240
        rooms = {b["bootstrap_room"] for b in seen["d"]}
        assert len(rooms) == 240 and rooms == {b["bootstrap_room"] for b in seen["p1"] + seen["p2"]}
        assert all(b["bootstrap_host"] == "127.0.0.1" and b["bootstrap_port"] == 8998 for b in seen["d"])
    else:  # prefill first (one token, remote decode), then decode with the prefill's KV handle
        assert all(b["max_tokens"] == 1 and b["kv_transfer_params"] == {"do_remote_decode": True}
                   for b in seen["p1"] + seen["p2"])  # fmt: skip
        assert {b["kv_transfer_params"]["remote_engine"] for b in seen["d"]} == {"p1", "p2"}
        assert all(b["max_tokens"] == 8 for b in seen["d"])


def test_a_plan_without_node_aligned_islands_is_refused_with_the_fix(plan_path: Path, tmp_path: Path) -> None:
    from pipeline.deploy import execute

    plan = plans.load(plan_path)
    k = next(k for k, i in enumerate(plan.islands) if i.role == "prefill")
    first = plan.islands[k]
    assert first.hosts is not None
    ranges = [(r.start, r.end, r.fraction) for r in first.ranges]
    # as search.shapes=any may plan it: 1.5 hosts, after the last host the plan uses (the plan records no inventory)
    free = 1 + max(n for i in plan.islands if i.gpu == first.gpu and i.hosts for n in i.hosts.nodes)
    wide = island(first.gpu, 12, "prefill", 1, 12, 12, first.batch, ranges, free)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plans.to_json(dataclasses.replace(plan, inventory=None, islands=(
        *plan.islands[:k], wide, *plan.islands[k + 1:])))))  # fmt: skip
    r = in_process(execute, "deploy", f"plan={path}", f"out={tmp_path}/d")
    one_line(r, "error: plan island ")
    assert "is neither a divisor of a 8-GPU host nor whole hosts" in r.stderr and "search.shapes=nodes" in r.stderr


@pytest.mark.parametrize("engine, gpu, says", [
    ("vllm", None, "the vLLM launch files load the FP8 checkpoint's experts in FP8"),
    ("sglang", "MI355X", "an NVIDIA (CUDA) path only"),
])  # fmt: skip
def test_an_island_priced_with_fp4_experts_is_refused_where_its_launch_would_not_run_fp4(
    plan_path: Path, tmp_path: Path, engine: str, gpu: str | None, says: str
) -> None:
    """SGLang requantizes the FP8 checkpoint's routed experts to NVFP4 as they load (tests/test_sglang_check.py reads
    that back); vLLM's launch files do not, and the NVFP4 path is NVIDIA's: there an island priced at FP4 experts
    would not run what was priced, so no launch files are written for the plan, and the message gives the fix."""
    from pipeline.deploy import execute
    from plan import Precision

    plan = plans.load(plan_path)
    k = next(k for k, i in enumerate(plan.islands) if i.role == "decode")
    fp4 = dataclasses.replace(plan.islands[k], precision=Precision("fp8", "fp4"), gpu=gpu or plan.islands[k].gpu)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plans.to_json(dataclasses.replace(plan, islands=(
        *plan.islands[:k], fp4, *plan.islands[k + 1:])))))  # fmt: skip
    r = in_process(execute, "deploy", f"plan={path}", f"engine={engine}", f"out={tmp_path}/d")
    one_line(r, "error: ")
    assert "priced with FP4 routed experts" in r.stderr and says in r.stderr
    assert "+costmodel.fixes.experts_fp8=true" in r.stderr
    assert not (tmp_path / "d").exists()


def test_the_launch_folder_cannot_be_written_where_a_user_cannot_write(plan_path: Path) -> None:
    from pipeline.deploy import execute

    one_line(in_process(execute, "deploy", f"plan={plan_path}", "out=/proc/x"),
             "error: out=/proc/x: cannot write the launch files there")  # fmt: skip


def test_the_deployment_readme_names_the_rate_the_simulator_sustains_where_it_is_lower(
    plan_path: Path, tmp_path: Path
) -> None:
    from plan import Verification

    plan = plans.load(plan_path)
    checked = Verification(offered_req_s=1.0, throughput_req_s=1.0, simulated_over_stated=1.0, ttft_ms_p50=1.0,
                           ttft_ms_p99=1.0, tpot_ms_p99=1.0, ttft_ms_at_slo=1.0, tpot_ms_at_slo=1.0,
                           slo_attainment=1.0, sustained=True, why_not="", steady_state="", requests=1, sim_wall_s=1.0,
                           slo="", sustained_req_s=123.4, sustained_over_stated=1.0)  # fmt: skip
    for sustained, title in ((True, "req/s within the SLOs (sglang"), (False, "req/s within the SLOs, 123.4 in the "
                                                                              "simulator")):  # fmt: skip
        v = dataclasses.replace(checked, sustained=sustained)
        path = tmp_path / f"plan_{sustained}.json"
        path.write_text(json.dumps(plans.to_json(dataclasses.replace(plan, verification=v))))
        deploy(path, tmp_path / f"d_{sustained}")
        first = (tmp_path / f"d_{sustained}" / "README.md").read_text().splitlines()[0]
        assert first.startswith(f"# Deployment of a plan: {plan.rate_req_s:.1f} ") and title in first, first


def test_configurations_engines_cannot_run_are_never_proposed() -> None:
    from costmodel.catalog import load_gpu, load_model
    from costmodel.island_bench import benchmark_island
    from costmodel.settings import CostSettings, EngineSettings
    from pipeline.planning.workload import make_ranges, synthetic_normal

    wl = synthetic_normal("n", 2000, 1000, 0, 8000, 100, 1000)
    r = make_ranges(wl, 1000)
    model = load_model("deepseek_v3")
    args = (load_gpu("H800"), 24, model, r.mid, r.p, 100, 1000)
    free = benchmark_island(*args, cost=CostSettings(engine=EngineSettings(runnable_only=False)))
    engines = benchmark_island(*args, cost=CostSettings())
    assert 3 in free.prefill.tp and 3 in free.decode.tp  # 24 GPUs: TP 3 (or 6, 12, 24) splits 128 heads unevenly
    for t in (engines.prefill, engines.decode):
        assert set(t.tp) and all(model.n_heads % tp == 0 for tp in t.tp)


def test_a_plan_of_another_model_is_not_deployed_onto_deepseek_v3s_default_weights(tmp_path: Path) -> None:
    """conf/deploy.yaml's default model_path is DeepSeek-V3's weights: a Qwen3-30B plan deployed with it is refused
    in one line naming the model, nothing written; with its own weights' folder given, its launch files point
    there."""
    from pipeline.deploy import execute

    path, _ = plan_of(tmp_path, "model=qwen3_30b_a3b", "costmodel=calibrated")
    one_line(in_process(execute, "deploy", f"plan={path}", f"out={tmp_path}/d"),
             "error: conf/deploy.yaml (or its overrides): model_path=/models/DeepSeek-V3 is the default, "
             "deepseek_v3's weights, and this plan is for qwen3_30b_a3b: give model_path=<its weights' folder on "
             "every host>")  # fmt: skip
    assert not (tmp_path / "d").exists()
    deploy(path, tmp_path / "q", "model_path=/models/Qwen3-30B-A3B-FP8", "target=k8s")
    manifests = (tmp_path / "q" / "manifests.yaml").read_text()
    assert "/models/Qwen3-30B-A3B-FP8" in manifests and "DeepSeek-V3" not in manifests


def test_engines_sharing_a_host_are_not_written_as_host_scripts_on_one_port(tmp_path: Path) -> None:
    """tiny_hetero's Qwen3-30B plan packs islands smaller than a host side by side; target=shell starts every engine
    of a host on the same ports (and the router would reach them at one address), so it is refused in one line
    naming the two engines and the host, nothing written; target=k8s runs a pod per engine."""
    from pipeline.deploy import execute

    path, _ = plan_of(tmp_path, "model=qwen3_30b_a3b", "costmodel=calibrated")
    plan = plans.load(path)
    hosts = [(isl.gpu, h) for isl in plan.islands if isl.serving and isl.hosts for h in isl.hosts.nodes]
    assert len(hosts) > len(set(hosts))  # (the case: two islands on one host)
    r = in_process(execute, "deploy", f"plan={path}", f"out={tmp_path}/s", "model_path=/models/Qwen3-30B-A3B-FP8")
    one_line(r, "error: engines i")
    assert "target=shell starts every engine of a host on the same ports: deploy with target=k8s" in r.stderr
    assert not (tmp_path / "s").exists()


def test_a_range_no_prompt_of_the_workload_fell_in_is_routed_as_the_range_below_it() -> None:
    """The Azure conversation trace has no prompt of 6,500-6,750 tokens, so a plan routes that range nowhere; its
    routing.json still covers every length (the router refuses a gap): the gap goes as the range below it, and
    lengths below the first range as the first range."""
    from deployment.router.table import load
    from deployment.routing import _fill_gaps

    islands = {"0": {"engines": ["http://a:1"], "ranges": [[250, 6500, 0.25], [6750, 9000, 1.0]]},
               "1": {"engines": ["http://b:1"], "ranges": [[250, 6500, 0.75]]}}  # fmt: skip
    _fill_gaps(islands)
    assert islands["0"]["ranges"] == [[0, 250, 0.25], [250, 6500, 0.25], [6500, 6750, 0.25], [6750, 9000, 1.0]]
    assert islands["1"]["ranges"] == [[0, 250, 0.75], [250, 6500, 0.75], [6500, 6750, 0.75]]
    decode = {"2": {"engines": ["http://c:1"], "ranges": [[0, 250, 1.0], [250, 6500, 1.0], [6750, 9000, 1.0]]}}
    _fill_gaps(decode)
    t = load({"protocol": "sglang", "islands": {"prefill": islands, "decode": decode}})
    assert [(r.start, r.end) for r in t.ranges][:3] == [(0, 250), (250, 6500), (6500, 6750)]
