"""deployment/crd.py against the pinned CRDs in tests/data/crds (README.md there says where each comes from):
the upstream projects' own samples pass, each kind of mistake gives one precise error, and every
LeaderWorkerSet Archipelago writes (the tiny plan's, the Table 5.1 plans') passes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

import plan as plans
from deployment.crd import load_crd, validate
from deployment.engines import ENGINES
from deployment.folder import files
from deployment.options import DeployOptions
from helpers import REPO, plan_of

CRDS = REPO / "tests" / "data" / "crds"
SAMPLES = CRDS / "samples"
LWS = load_crd(CRDS / "leaderworkerset.x-k8s.io_leaderworkersets.yaml.gz")
DGD = load_crd(CRDS / "nvidia.com_dynamographdeployments.yaml.gz")
CRD_OF = {"LeaderWorkerSet": LWS, "DynamoGraphDeployment": DGD}
TABLE_PLANS = sorted((REPO / "tests" / "data" / "plans").glob("*.json"))


def resources(path: Path, kind: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict) and d.get("kind") == kind]


def sample(name: str, kind: str) -> dict[str, Any]:
    return copy.deepcopy(resources(SAMPLES / name, kind)[0])


# lws v0.10.0 config/samples/leaderworkerset_v1_leaderworkerset.yaml, docs/examples/sglang/lws.yaml,
# docs/examples/vllm/GPU/lws.yaml; dynamo v1.0.1 examples/backends/{sglang,vllm}/deploy/*.yaml
@pytest.mark.parametrize("name", sorted(p.name for p in SAMPLES.glob("*.yaml")))
def test_the_upstream_samples_pass(name: str) -> None:
    docs = [d for kind in CRD_OF for d in resources(SAMPLES / name, kind)]
    assert docs
    for doc in docs:
        assert validate(doc, CRD_OF[doc["kind"]]) == []


def test_the_crds_are_the_pinned_versions() -> None:
    assert LWS["spec"]["group"] == "leaderworkerset.x-k8s.io" and [v["name"] for v in LWS["spec"]["versions"]] == ["v1"]
    assert DGD["spec"]["group"] == "nvidia.com" and [v["name"] for v in DGD["spec"]["versions"]] == ["v1alpha1"]


def test_a_wrong_type_is_named_by_its_path() -> None:
    doc = sample("lws_docs_examples_sglang_lws.yaml", "LeaderWorkerSet")
    doc["spec"]["leaderWorkerTemplate"]["size"] = "2"
    assert validate(doc, LWS) == ["spec.leaderWorkerTemplate.size: '2' is not of type 'integer'"]
    dgd = sample("dynamo_examples_backends_sglang_deploy_disagg-multinode.yaml", "DynamoGraphDeployment")
    dgd["spec"]["services"]["decode"]["multinode"]["nodeCount"] = "2"
    assert validate(dgd, DGD) == ["spec.services.decode.multinode.nodeCount: '2' is not of type 'integer'"]


def test_an_int_or_string_takes_both_but_not_a_float() -> None:
    doc = sample("lws_docs_examples_sglang_lws.yaml", "LeaderWorkerSet")
    limits = doc["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["resources"]["limits"]
    for ok in (1, "1", "500m"):
        limits["nvidia.com/gpu"] = ok
        assert validate(doc, LWS) == []
    limits["nvidia.com/gpu"] = 1.5
    path = "spec.leaderWorkerTemplate.workerTemplate.spec.containers[0].resources.limits.nvidia.com/gpu"
    assert validate(doc, LWS) == [f"{path}: 1.5 is not of type 'integer', 'string'"]


def test_an_unknown_field_is_reported_as_the_api_server_would_drop_it() -> None:
    doc = sample("lws_docs_examples_sglang_lws.yaml", "LeaderWorkerSet")
    doc["spec"]["leaderWorkerTemplate"]["sizee"] = 2
    doc["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["gpus"] = 8
    assert validate(doc, LWS) == [
        "spec.leaderWorkerTemplate.leaderTemplate.spec.containers[0].gpus: unknown field",
        "spec.leaderWorkerTemplate.sizee: unknown field",
    ]
    dgd = sample("dynamo_examples_backends_sglang_deploy_disagg.yaml", "DynamoGraphDeployment")
    dgd["spec"]["services"]["prefill"]["extraPodSpec"]["mainContainer"]["cmd"] = ["python3"]
    assert validate(dgd, DGD) == ["spec.services.prefill.extraPodSpec.mainContainer.cmd: unknown field"]


def test_a_missing_required_field_is_named() -> None:
    doc = sample("lws_docs_examples_vllm_GPU_lws.yaml", "LeaderWorkerSet")
    del doc["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["name"]
    assert validate(doc, LWS) == ["spec.leaderWorkerTemplate.workerTemplate.spec.containers[0].name: Required value"]
    del doc["metadata"]["name"]
    assert "metadata.name: Required value" in validate(doc, LWS)
    dgd = sample("dynamo_examples_backends_vllm_deploy_disagg-multinode.yaml", "DynamoGraphDeployment")
    dgd["spec"]["services"]["decode"]["multinode"] = {}
    assert validate(dgd, DGD) == ["spec.services.decode.multinode.nodeCount: Required value"]


def test_a_wrong_api_version_or_kind_is_refused() -> None:
    doc = sample("lws_config_samples_leaderworkerset_v1_leaderworkerset.yaml", "LeaderWorkerSet")
    doc["apiVersion"] = "leaderworkerset.x-k8s.io/v1alpha1"
    assert validate(doc, LWS) == [
        "apiVersion: 'leaderworkerset.x-k8s.io/v1alpha1' is not served by "
        "leaderworkersets.leaderworkerset.x-k8s.io (leaderworkerset.x-k8s.io/v1)"
    ]
    doc["apiVersion"] = "apps/v1"
    assert validate(doc, LWS)[0].startswith("apiVersion: 'apps/v1' is not served")
    doc = sample("lws_config_samples_leaderworkerset_v1_leaderworkerset.yaml", "LeaderWorkerSet")
    doc["kind"] = "DynamoGraphDeployment"
    assert validate(doc, LWS) == ["kind: 'DynamoGraphDeployment' is not 'LeaderWorkerSet'"]


def leader_worker_sets(path: Path, engine: str) -> list[dict[str, Any]]:
    """The LeaderWorkerSets of the k8s manifests Archipelago writes for the plan at `path`."""
    _, out = files(plans.load(path), DeployOptions(engine=engine, target="k8s"), str(path))
    return [d for d in yaml.safe_load_all(out["manifests.yaml"]) if d["kind"] == "LeaderWorkerSet"]


@pytest.fixture(scope="module")
def tiny_plan_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path, _ = plan_of(tmp_path_factory.mktemp("plan"))
    return path


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_leader_worker_set_archipelago_writes_for_the_tiny_plan_passes(tiny_plan_path: Path, engine: str) -> None:
    docs = leader_worker_sets(tiny_plan_path, engine)
    assert docs  # the tiny plan has multi-host engines
    for doc in docs:
        assert validate(doc, LWS) == [], doc["metadata"]["name"]


@pytest.mark.skipif(not TABLE_PLANS, reason="no plans in tests/data/plans")
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_leader_worker_set_archipelago_writes_for_the_table_plans_passes(engine: str) -> None:
    seen = 0
    for path in TABLE_PLANS:
        for doc in leader_worker_sets(path, engine):
            assert validate(doc, LWS) == [], (path.name, doc["metadata"]["name"])
            seen += 1
    assert seen  # the Table 5.1 plans have multi-host engines: this checks at least one LeaderWorkerSet
