"""The YAML catalogue: every entry loads and cites its sources; bad entries fail clearly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from costmodel import catalog
from costmodel.catalog import CatalogError, build, gpu_names, load_gpu, load_model, model_names, priced_model_names
from costmodel.specs import GPU, Model
from pipeline.errors import ConfigError
from pipeline.planning.inventory import inventory_from_cfg

CONF = catalog.CONF_DIR
SPEC_GPUS = [
    "DGX-B300",
    "DGX-B200",
    "GB200-NVL72",
    "GB300-NVL72",
    "Rubin-NVL144",
    "RubinU-NVL576",
    "H200",
    "H800",
    "H20",
    "H20-3E",
    "MI300X",
    "MI308X",
]


def test_catalogue_has_the_spec_table_and_the_datasheet_gpus() -> None:
    assert set([*SPEC_GPUS, "H100-SXM", "A100-80GB", "L40S"]) <= set(gpu_names())
    assert {"deepseek_v3", "qwen3_235b_a22b", "qwen3_30b_a3b"} <= set(model_names())
    for name in gpu_names():
        load_gpu(name)
    for name in priced_model_names():
        load_model(name)
    assert set(model_names()) == set(priced_model_names())  # every model of the catalogue is priced


def test_an_attention_kind_the_cost_model_does_not_price_is_refused_in_one_line() -> None:
    v3 = dict(yaml.safe_load((CONF / "model" / "deepseek_v3.yaml").read_text()), name="m")
    with pytest.raises(CatalogError, match=r"model m's attention is `linear` \(linear attention .*refused"):
        build(Model, {**v3, "attention": "linear"}, "conf/model/m.yaml")
    # a dense model (no routed experts) has no experts of any kind, and every layer dense
    llama = dict(yaml.safe_load((CONF / "model" / "llama_3_3_70b.yaml").read_text()), name="d")
    for bad, words in (({"top_k": 2}, "`top_k` must be 0"),
                       ({"n_dense_layers": 79}, "every layer is: `n_dense_layers` must be 80")):
        with pytest.raises(CatalogError, match=re.escape(f"model d is dense (n_routed_experts 0), so {words}")):
            build(Model, {**llama, **bad}, "x.yaml")
    # DeepSeek Sparse Attention's indexer: MLA only, its three figures together
    for bad in ({"attention": "gqa", "n_kv_heads": 8, "head_dim": 128}, {"index_n_heads": 0}):
        with pytest.raises(CatalogError, match="DeepSeek Sparse Attention needs MLA and all of"):
            build(Model, {**v3, "index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128, **bad}, "x.yaml")


def test_thesis_prices_and_inventory_budgets() -> None:
    assert (load_gpu("H20").price_per_hour, load_gpu("H800").price_per_hour, load_gpu("H200").price_per_hour) == (
        1,
        2,
        4,
    )
    for inv in ("hetero_a", "hetero_b", "homo_c"):
        import yaml

        cfg = yaml.safe_load((CONF / "inventory" / f"{inv}.yaml").read_text())
        assert inventory_from_cfg(inv, cfg).cost_per_hour == 512.0


@pytest.mark.parametrize(
    "path", sorted((CONF / "gpu").glob("*.yaml")) + sorted((CONF / "model").glob("*.yaml")), ids=lambda p: p.stem
)
def test_every_figure_cites_a_source(path: Path) -> None:
    text = path.read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert re.search(r"spec|datasheet|config\.json|thesis|report", header, re.I), f"{path} names no source"
    if path.parent.name == "gpu":
        price_line = next(line for line in text.splitlines() if line.startswith("price_per_hour"))
        assert "#" in price_line and len(price_line.split("#", 1)[1].strip()) > 10, f"{path}: price has no source"


def test_unknown_gpu_lists_the_choices() -> None:
    with pytest.raises(CatalogError, match=r"unknown GPU 'H2000'; choose from \[.*'H200'.*\]"):
        load_gpu("H2000")


def _gpu_fields(**over: object) -> dict[str, object]:
    base = dict(
        name="X",
        sm=132,
        comm_sm=20,
        tflops_bf16=989,
        tflops_fp8=1979,
        tflops_fp4=0,
        mem_gb=80,
        mem_bw_gb_s=3350,
        nvlink_bw_gb_s=450,
        scaleout_bw_gb_s=50,
        gpus_per_node=8,
        grouped_gemm_table="default",
        price_per_hour=2.0,
    )
    base.update(over)
    return base


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"mem_gb": -80}, r"x\.yaml: `mem_gb > 0` must hold for GPU X, got -80"),
        ({"sm": 13.5}, r"x\.yaml: field `sm` must be a whole number, got 13.5"),
        ({"comm_sm": 200}, r"`0 <= comm_sm < sm` must hold"),
        ({"tflops_bf16": "fast"}, r"field `tflops_bf16` must be a number"),
        ({"grouped_gemm_table": "h100"}, r"`grouped_gemm_table` of GPU X must be one of \['default', 'h20'\]"),
        ({"price_per_hour": -1}, r"`price_per_hour >= 0`"),
        ({"colour": "green"}, r"unknown field\(s\) \['colour'\]; valid fields: \["),
    ],
)
def test_bad_gpu_fields(over: dict[str, object], message: str) -> None:
    with pytest.raises(CatalogError, match=message):
        build(GPU, _gpu_fields(**over), "x.yaml")


def test_missing_gpu_field() -> None:
    fields = _gpu_fields()
    del fields["mem_bw_gb_s"]
    with pytest.raises(CatalogError, match=r"x\.yaml: missing field\(s\) \['mem_bw_gb_s'\]"):
        build(GPU, fields, "x.yaml")


def test_bad_model_fields() -> None:
    import yaml

    cfg = yaml.safe_load((CONF / "model" / "qwen3_30b_a3b.yaml").read_text())
    with pytest.raises(CatalogError, match=r"`n_kv_heads > 0` must hold for GQA model q"):
        build(Model, {**cfg, "name": "q", "n_kv_heads": 0}, "m.yaml")
    with pytest.raises(CatalogError, match=r"`top_k <= n_routed_experts`"):
        build(Model, {**cfg, "name": "q", "top_k": 500}, "m.yaml")
    with pytest.raises(CatalogError, match=r"`attention` of model q must be one of \['mla', 'gqa'\]"):
        build(Model, {**cfg, "name": "q", "attention": "ssm"}, "m.yaml")


def test_invalid_yaml_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "Broken.yaml").write_text("sm: [1, 2\n")
    monkeypatch.setattr(catalog, "CONF_DIR", tmp_path)
    catalog.load_gpu.cache_clear()
    try:
        with pytest.raises(CatalogError, match=r"Broken\.yaml: not valid YAML"):
            catalog.load_gpu("Broken")
    finally:
        catalog.load_gpu.cache_clear()


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"gpus": {"H200": -4}}, r"conf/inventory/inv\.yaml: `gpus\.H200 >= 0` must hold, got -4"),
        ({"gpus": {"H200": 2.5}}, r"`gpus\.H200` must be a whole number of GPUs, got 2\.5"),
        ({"gpus": {"H2000": 8}}, r"unknown GPU 'H2000' in `gpus`; choose from \["),
        ({"gpus": {"H200": 0}}, r"has no GPUs"),
        ({"gpus": {}}, r"field `gpus` must map GPU names to counts"),
        ({"gpus": {"H200": 8}, "prices": {"H20": 1}}, r"`prices` names GPU\(s\) \['H20'\] that are not in `gpus`"),
        ({"gpus": {"H200": 8}, "prices": {"H200": -1}}, r"`prices\.H200` must be a non-negative number"),
        ({"gpus": {"H200": 8}, "budget": 3}, r"unknown field\(s\) \['budget'\]"),
    ],
)
def test_bad_inventories(cfg: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        inventory_from_cfg("inv", cfg)


def test_inventory_price_override() -> None:
    inv = inventory_from_cfg("inv", {"gpus": {"H200": 8, "H20": 8}, "prices": {"H200": 3.5}})
    assert inv.cost_per_hour == 8 * 3.5 + 8 * 1.0
    assert inv.count("H20") == 8 and inv.count("H800") == 0


def test_unknown_model_lists_the_choices() -> None:
    with pytest.raises(CatalogError, match=r"unknown model 'gpt5'; choose from \[.*'deepseek_v3'.*\]"):
        load_model("gpt5")


# each model's published total and activated parameters (billions), cited in its conf/model file
PUBLISHED_PARAMS = {"deepseek_v3": (671, 37), "qwen3_235b_a22b": (235, 22), "qwen3_30b_a3b": (30.5, 3.3),
                    "kimi_k2": (1040, 32), "qwen3_coder_480b_a35b": (480, 35), "glm_4_6": (355, 32),
                    "gpt_oss_120b": (116.83, 5.13), "deepseek_v32": (671, 37),
                    "llama_3_3_70b": (70.6, 70.6)}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_each_models_dimensions_count_the_parameters_its_makers_publish(name: str) -> None:
    """The weights the cost model counts from a model's dimensions (`Model.params`, `active_params`: embeddings,
    attention, dense MLPs, experts and routers; norms and MTP modules aside) are its makers' published totals within
    2 % and its activated parameters within 10 % (makers count the embedding or not): a mistyped dimension shows."""
    m = load_model(name)
    total, active = PUBLISHED_PARAMS[name]
    assert m.params / 1e9 == pytest.approx(total, rel=0.02) and m.active_params / 1e9 == pytest.approx(active, rel=0.1)


@pytest.mark.parametrize(("name", "gpu", "fits", "short"), [
    ("kimi_k2", "H200", 16, 4), ("qwen3_coder_480b_a35b", "H200", 8, 2), ("glm_4_6", "H20", 8, 2)])  # fmt: skip
def test_the_catalogues_new_models_price_on_an_island_that_holds_them_and_not_on_one_that_does_not(
    name: str, gpu: str, fits: int, short: int
) -> None:
    """Kimi-K2 (about 1.03 TB of FP8 weights), Qwen3-Coder-480B (480 GB) and GLM-4.6 (353 GB) each prefill and decode
    every range on an island that holds their weights beside a KV cache (16 H200 of 141 GB; 8 H200; 8 H20 of 96 GB),
    and on one whose memory is less than their weights (4 H200, 564 GB; 2 H200, 282 GB; 2 H20, 192 GB) neither."""
    from costmodel.island_bench import benchmark_island
    from pipeline.planning.workload import make_ranges, synthetic_normal

    ranges = make_ranges(synthetic_normal("fig4_2", 500, 2000, 0, 8000, 100, 1000), 125)
    m = load_model(name)
    for size, holds in ((fits, True), (short, False)):
        b = benchmark_island(load_gpu(gpu), size, m, ranges.mid, ranges.p, 100, 1000)
        served = bool((b.prefill_req_s > 0).all() and (b.decode_req_s > 0).all())
        assert served is holds, (name, gpu, size)


def test_gpt_oss_with_its_mxfp4_experts_fits_one_h20_and_not_one_l40s() -> None:
    """GPT-OSS-120B's weights are about 65 GB with its experts at 4.25 bits (they would be 117 GB at a byte a weight):
    one H20 (96 GB) prefills and decodes every range, one L40S (48 GB) neither."""
    from costmodel.island_bench import benchmark_island
    from pipeline.planning.workload import make_ranges, synthetic_normal

    ranges = make_ranges(synthetic_normal("fig4_2", 500, 2000, 0, 8000, 100, 1000), 125)
    m = load_model("gpt_oss_120b")
    for gpu, holds in (("H20", True), ("L40S", False)):
        b = benchmark_island(load_gpu(gpu), 1, m, ranges.mid, ranges.p, 100, 1000)
        assert bool((b.prefill_req_s > 0).all() and (b.decode_req_s > 0).all()) is holds, gpu
