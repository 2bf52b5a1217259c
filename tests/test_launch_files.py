"""Launch files that run what they say: no value of a plan or a setting reaches a shell as code; the Kubernetes
manifests carry what a multi-host RDMA deployment needs; bad input to `pipeline.deploy` is one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from launched import HOST, LEADER, engine_env, ran

from deployment.engines import ENGINES
from deployment.targets import TARGETS
from helpers import REPO, in_process, one_line, plan_of


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path, _ = plan_of(tmp_path_factory.mktemp("plan"))
    return path


def deploy(*args: str) -> Any:
    from pipeline.deploy import execute

    return in_process(execute, "deploy", *args)


HOSTILE = [
    "/m/$(touch {mark})",
    "/m;touch {mark};echo $HOME",
    "/m/`touch {mark}`",
    "/m/$$ '\"\\ {{x}} ${{HOME}} $(PATH)",  # shell and Kubernetes expansions, quotes, backslash
    "/m/x: y # z\u2028  hostPID: true\x85- {{{{ .Values }}}}",  # YAML's indicators, Unicode's line breaks, a template
]


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_value_reaches_the_engine_verbatim_and_nothing_else_runs(plan_path: Path, tmp_path: Path, target: str,
                                                                   engine: str, hostile: str) -> None:  # fmt: skip
    import plan as plans
    from deployment.folder import write
    from deployment.options import DeployOptions

    mark = tmp_path / "ran"
    model = hostile.format(mark=mark)
    if hostile == HOSTILE[0]:  # as a user gives it on the command line
        r = deploy(f"plan={plan_path}", f"out={tmp_path / 'd'}", f"engine={engine}", f"target={target}",
                   f"model_path='{model}'")  # fmt: skip
        assert r.returncode == 0, r.stderr
    else:  # quotes and braces Hydra's override grammar would not take: the settings record itself
        write(plans.load(plan_path), DeployOptions(engine, target, model), tmp_path / "d", str(plan_path))
    runs = ran(tmp_path / "d", target, tmp_path)
    assert runs and not mark.exists()
    for run in runs:
        argv = run.argv
        path = argv[argv.index("--model-path") + 1] if engine == "sglang" else argv[2]
        assert path == model, run.where
    if target == "k8s":  # an argv list: the model path is one element of the container's command or arguments
        docs = list(yaml.safe_load_all((tmp_path / "d" / "manifests.yaml").read_text()))
        mounts = [m["mountPath"] for d in docs for c in _containers(d) if c["name"] == "engine"
                  for m in c["volumeMounts"] if m["name"] == "weights"]  # fmt: skip
        assert mounts and set(mounts) == {model}


def test_host_known_values_are_explicit_references(plan_path: Path, tmp_path: Path) -> None:
    """The leader's address and a pod's index come from the host's environment, named, not from a value."""
    deploy(f"plan={plan_path}", f"out={tmp_path / 's'}", "engine=vllm")
    deploy(f"plan={plan_path}", f"out={tmp_path / 'k'}", "engine=vllm", "target=k8s")
    scripts = {r.where: r for r in ran(tmp_path / "s", "shell", tmp_path)}
    multi = [r for r in scripts.values() if "--data-parallel-address" in r.argv]
    assert multi and all(r.argv[r.argv.index("--data-parallel-address") + 1] == LEADER for r in multi)
    texts = [p.read_text() for p in (tmp_path / "s").glob("hosts/*/*.sh")]
    assert any('"${LEADER_ADDR}"' in t for t in texts)
    assert all("${LEADER_ADDR:?" in t for t in texts if '"${LEADER_ADDR}"' in t)  # unset: the script stops, saying so
    workers = [r for r in ran(tmp_path / "k", "k8s", tmp_path) if r.where.endswith("worker")]
    assert workers
    for r in workers:  # index 1 of its LeaderWorkerSet: its first data parallel rank is one host's ranks in
        local = int(r.argv[r.argv.index("--data-parallel-size-local") + 1])
        assert r.argv[r.argv.index("--data-parallel-start-rank") + 1] == str(local)
        assert "--headless" in r.argv


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {})
    lwt = spec.get("leaderWorkerTemplate", {})
    return [c for t in (lwt.get("leaderTemplate"), lwt.get("workerTemplate"), spec.get("template")) if t
            for c in t["spec"]["containers"]]  # fmt: skip


def _pods(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    spec = doc.get("spec", {})
    lwt = spec.get("leaderWorkerTemplate", {})
    named = (
        ("leader", lwt.get("leaderTemplate")),
        ("worker", lwt.get("workerTemplate")),
        ("pod", spec.get("template")),
    )
    return [(k, t["spec"]) for k, t in named if t]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_kubernetes_engines_get_weights_rdma_ipc_lock_probes_and_the_host_network_option(
    plan_path: Path, tmp_path: Path, engine: str
) -> None:
    deploy(f"plan={plan_path}", f"out={tmp_path / 'a'}", f"engine={engine}", "target=k8s")
    deploy(f"plan={plan_path}", f"out={tmp_path / 'b'}", f"engine={engine}", "target=k8s", "k8s.weights_pvc=dsv3",
           "k8s.rdma_resource=rdma/hca", "k8s.host_network=true")  # fmt: skip
    for folder, pvc in (("a", None), ("b", "dsv3")):
        docs = [
            d
            for d in yaml.safe_load_all((tmp_path / folder / "manifests.yaml").read_text())
            if d["kind"] in ("Deployment", "LeaderWorkerSet") and d["metadata"]["name"] != "archipelago-router"
        ]
        assert docs
        for d in docs:
            for kind, pod in _pods(d):
                (c,) = pod["containers"]
                volume = next(v for v in pod["volumes"] if v["name"] == "weights")
                if pvc:
                    assert volume["persistentVolumeClaim"] == {"claimName": "dsv3", "readOnly": True}
                    assert c["resources"]["limits"]["rdma/hca"] == 1 and pod["hostNetwork"] is True
                    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
                else:
                    assert volume["hostPath"] == {"path": "/models/DeepSeek-V3", "type": "Directory"}
                    assert c["resources"]["limits"]["rdma/rdma_shared_device_a"] == 1 and "hostNetwork" not in pod
                assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
                assert {"name": "weights", "mountPath": "/models/DeepSeek-V3", "readOnly": True} in c["volumeMounts"]
                if kind == "worker":  # no HTTP server on a multi-host engine's other hosts
                    assert "readinessProbe" not in c
                else:
                    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                        assert c[probe]["httpGet"] == {"path": "/health", "port": 30000}
                    start = c["startupProbe"]
                    assert start["periodSeconds"] * start["failureThreshold"] >= 3600  # a 671B model loads for long


def test_the_kubernetes_router_listens_on_its_pod_and_takes_its_key_from_a_secret(plan_path: Path,
                                                                                   tmp_path: Path) -> None:  # fmt: skip
    deploy(f"plan={plan_path}", f"out={tmp_path / 'k'}", "target=k8s")
    docs = list(yaml.safe_load_all((tmp_path / "k" / "manifests.yaml").read_text()))
    router = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "archipelago-router")
    (c,) = router["spec"]["template"]["spec"]["containers"]
    assert c["command"][c["command"].index("--host") + 1] == "0.0.0.0"
    assert c["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "archipelago-router", "key": "api-key",
                                                        "optional": True}  # fmt: skip
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"


def test_vllm_engines_announce_their_own_address_for_kv_transfer(plan_path: Path, tmp_path: Path) -> None:
    """NIXL's side channel must be reachable from the other host: the host's (or pod's) address, never localhost."""
    for target in ("shell", "k8s"):
        deploy(f"plan={plan_path}", f"out={tmp_path / target}", "engine=vllm", f"target={target}")
        runs = ran(tmp_path / target, target, tmp_path)
        assert runs and all(engine_env(r).get("VLLM_NIXL_SIDE_CHANNEL_HOST") == HOST for r in runs), target


# --- bad input: one line --------------------------------------------------------------------------------------------


def test_a_folder_that_cannot_be_written_is_one_line(plan_path: Path) -> None:
    one_line(deploy(f"plan={plan_path}", "out=/proc/x"), "error: out=/proc/x: cannot write the launch files there")


def _edited(plan_path: Path, tmp: Path, edit: Any) -> Path:
    data = json.loads(plan_path.read_text())
    edit(data)
    out = tmp / "edited.json"
    out.write_text(json.dumps(data))
    return out


EDITS = [
    (lambda d: d["islands"][0].update(batch=-3), "error: "),
    (lambda d: d["islands"][0].update(gpu=7), "error: "),
    (lambda d: d.update(islands="none"), "error: "),
    (lambda d: d.pop("islands"), "error: "),
    (lambda d: d["islands"][0].update(role="both"), "error: "),
]


@pytest.mark.parametrize("k", range(len(EDITS)))
def test_a_hand_edited_plan_is_refused_in_one_line(plan_path: Path, tmp_path: Path, k: int) -> None:
    edit, start = EDITS[k]
    r = deploy(f"plan={_edited(plan_path, tmp_path, edit)}", f"out={tmp_path / 'd'}")
    one_line(r, start)
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("value", ["relative/path", "''"])
def test_a_model_path_that_is_not_an_absolute_path_is_refused(plan_path: Path, tmp_path: Path, value: str) -> None:
    one_line(deploy(f"plan={plan_path}", f"out={tmp_path / 'd'}", f"model_path={value}"), "error: model_path=")


def test_rdma_devices_and_an_expert_distribution_reach_the_engines(tmp_path: Path) -> None:
    plan_path = REPO / "tests" / "data" / "plans" / "table_5_1_hetero_a_azure_code.json"  # with redundant experts
    for out, engine in (("s", "sglang"), ("v", "vllm")):
        r = deploy(f"plan={plan_path}", f"out={tmp_path / out}", f"engine={engine}", "ib_devices='mlx5_0,mlx5_1'",
                   "sglang.expert_location=/models/eplb.json")  # fmt: skip
        assert r.returncode == 0, r.stderr
    sglang = ran(tmp_path / "s", "shell", tmp_path)
    assert sglang and all(r.argv[r.argv.index("--disaggregation-ib-device") + 1] == "mlx5_0,mlx5_1" for r in sglang)
    eplb = [r for r in sglang if "--enable-eplb" in r.argv]
    assert eplb and all(r.argv[r.argv.index("--init-expert-location") + 1] == "/models/eplb.json" for r in eplb)
    assert all(engine_env(r)["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"] == "3600" for r in sglang)
    vllm = ran(tmp_path / "v", "shell", tmp_path)
    assert vllm and all(engine_env(r)["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1" for r in vllm)


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_target_runs_the_command_the_engines_own_checks_judged(tmp_path: Path, target: str, engine: str) -> None:
    """tests/test_engine_contract.py runs every engine's command through its own checks; what each target's files
    actually run (a host script, a leader or worker pod) is that command, argument for argument, for every target and
    every engine of the registries."""
    import plan as plans
    from deployment.commands import command, engine_argv
    from deployment.deployable import engines
    from deployment.launch import WORKER, example_env
    from deployment.options import DeployOptions

    path = REPO / "tests" / "data" / "plans" / "table_5_1_hetero_a_azure_code.json"  # multi-host engines of both roles
    plan, opts = plans.load(path), DeployOptions(engine=engine, target=target)
    r = deploy(f"plan={path}", f"out={tmp_path / 'd'}", f"engine={engine}", f"target={target}")
    assert r.returncode == 0, r.stderr
    # each run launches a host of one engine: its leader, another of its hosts by rank (a host script knows its rank),
    # or a LeaderWorkerSet's worker (a pod template that reads its index when it starts: index 1 here)
    by_name, seen = {e.name: e for e in engines(plan)}, set()
    for run in ran(tmp_path / "d", target, tmp_path):
        e = by_name[run.engine]
        ranks = [WORKER] if run.template else [k for k in range(e.nnodes) if run.argv == engine_argv(e, k, plan, opts)]
        assert ranks and run.argv == engine_argv(e, ranks[0], plan, opts), (run.where, run.argv)  # as judged
        env = example_env(command(e, ranks[0], plan, opts), 1 if ranks[0] == WORKER else ranks[0])
        assert all(run.env[name] == value for name, value in env.items()), run.where
        seen.add((e.name, ranks[0]))
    for e in engines(plan):  # every host of every engine runs: each by its rank, or its workers from one template
        assert {(e.name, k) for k in range(e.nnodes)} <= seen or {(e.name, 0), (e.name, WORKER)} <= seen, e.name


# --- a used folder: refused, or replaced whole ----------------------------------------------------------------------


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_folder_that_holds_an_earlier_deploy_is_refused_unless_replaced_and_then_replaced_whole(
    plan_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "d"
    assert deploy(f"plan={plan_path}", f"out={out}", "target=k8s").returncode == 0
    before = _tree(out)
    r = deploy(f"plan={plan_path}", f"out={out}", "engine=vllm")
    one_line(r, f"error: out={out}: holds an earlier deploy; give replace=true to replace it whole")
    assert _tree(out) == before  # untouched
    r = deploy(f"plan={plan_path}", f"out={out}", "engine=vllm", "replace=true")
    assert r.returncode == 0, r.stderr
    after = _tree(out)
    assert "manifests.yaml" not in after and any(p.startswith("hosts/") for p in after)  # no k8s file beside vLLM's
    assert "(vllm, shell)" in after["README.md"].splitlines()[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "m.db", "mlflow.db"]  # nothing left beside it


@pytest.mark.parametrize("replace", ["false", "true"])
def test_a_folder_that_is_not_an_earlier_deploy_is_refused_even_with_replace(plan_path: Path, tmp_path: Path,
                                                                             replace: str) -> None:  # fmt: skip
    out = tmp_path / "notes"
    out.mkdir()
    (out / "README.md").write_text("# my notes\n")
    r = deploy(f"plan={plan_path}", f"out={out}", f"replace={replace}")
    one_line(r, f"error: out={out}: holds files that are not an earlier deploy (no README.md of pipeline.deploy's, "
                "whose first line starts '# Deployment of a plan:'); replace=true replaces only an earlier "
                "deploy")  # fmt: skip
    assert _tree(out) == {"README.md": "# my notes\n"}
    (tmp_path / "file").write_text("x")
    one_line(deploy(f"plan={plan_path}", f"out={tmp_path / 'file'}", "replace=true"),
             f"error: out={tmp_path / 'file'}: is not a folder")  # fmt: skip


def test_an_empty_folder_is_written(plan_path: Path, tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    assert deploy(f"plan={plan_path}", f"out={tmp_path / 'd'}").returncode == 0
    assert (tmp_path / "d" / "README.md").read_text().startswith("# Deployment of a plan: ")


@pytest.mark.parametrize("dies", ["writing", "renaming", "removing"])
def test_a_replace_that_dies_midway_leaves_the_old_folder_or_the_new_one(plan_path: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         dies: str) -> None:  # fmt: skip
    """A crash while the new files are written leaves the earlier deploy in place, untouched; one after the earlier
    deploy is renamed aside leaves each whole, in its own folder; never a folder that mixes the two."""
    import plan as plans
    from deployment import folder
    from deployment.options import DeployOptions

    out = tmp_path / "d"
    assert deploy(f"plan={plan_path}", f"out={out}", "target=k8s").returncode == 0
    before = _tree(out)

    class Crash(BaseException):
        pass

    def crash(*args: Any, **kwargs: Any) -> None:
        raise Crash

    if dies == "writing":  # after two of the new files
        real = folder._fill
        monkeypatch.setattr(folder, "_fill", lambda new, texts: (real(new, dict(list(texts.items())[:2])), crash()))
    elif dies == "renaming":  # the earlier deploy renamed aside, the new one not yet in its place
        rename, renames = Path.rename, []
        monkeypatch.setattr(Path, "rename", lambda p, to: crash() if renames.append(p) or len(renames) > 1
                            else rename(p, to))  # fmt: skip
    else:  # the new one in place, the earlier one not yet removed
        monkeypatch.setattr(folder.shutil, "rmtree", crash)
    with pytest.raises(Crash):
        folder.write(plans.load(plan_path), DeployOptions(engine="vllm"), out, str(plan_path), replace=True)
    monkeypatch.undo()
    beside = {p.name.split("-")[0]: _tree(p) for p in tmp_path.iterdir() if p.name.startswith(".d.")}
    new = beside.get(".d.new") or _tree(out)
    if dies == "writing":  # the earlier deploy is the folder; the half-written one a hidden sibling
        assert _tree(out) == before and set(beside) == {".d.new"} and len(new) == 2
        return
    assert beside[".d.old"] == before  # the earlier deploy, whole, aside
    assert new == folder.files(plans.load(plan_path), DeployOptions(engine="vllm"), str(plan_path))[1]  # the new, whole
    assert set(beside) == ({".d.old", ".d.new"} if dies == "renaming" else {".d.old"})
    assert out.exists() == (dies == "removing")


def test_a_replace_the_system_refuses_midway_puts_the_earlier_deploy_back(
    plan_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the new folder cannot be renamed into place, the earlier deploy is renamed back: one line, nothing
    changed, nothing left beside it."""
    import errno

    import plan as plans
    from deployment import folder
    from deployment.errors import DeployError
    from deployment.options import DeployOptions

    out = tmp_path / "d"
    assert deploy(f"plan={plan_path}", f"out={out}", "target=k8s").returncode == 0
    before, rename, renames = _tree(out), Path.rename, []

    def refused(p: Path, to: Path) -> Any:
        renames.append(p)
        if len(renames) == 2:  # the new folder into place
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return rename(p, to)

    monkeypatch.setattr(Path, "rename", refused)
    with pytest.raises(DeployError, match=f"^out={out}: cannot write the launch files there \\(Invalid cross-device"):
        folder.write(plans.load(plan_path), DeployOptions(engine="vllm"), out, str(plan_path), replace=True)
    assert _tree(out) == before and not [p for p in tmp_path.iterdir() if p.name.startswith(".d.")]
