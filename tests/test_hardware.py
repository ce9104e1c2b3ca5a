"""Tests for the hardware catalog (GPU/link files, default profiles) and cluster parsing."""

from __future__ import annotations

import json
import textwrap
from importlib import resources

import pytest
import yaml

from simulator.core.errors import UsageError
from simulator.hardware import catalog as hw
from simulator.hardware.profile import parse_profile

REQUIRED_GPUS = [
    "rtx3090", "rtx4090", "rtx-a6000", "rtx6000-ada", "l40s", "a10", "a100-40gb-sxm",
    "a100-80gb-sxm", "a100-80gb-pcie", "h100-pcie", "h100-sxm", "h200", "v100-sxm2-32gb",
]
REQUIRED_LINKS = [
    "pcie3-p2p", "pcie3-nop2p", "pcie4-p2p", "pcie4-nop2p", "pcie5-p2p", "pcie5-nop2p",
    "nvlink-bridge-3", "nvswitch-3", "nvswitch-4", "nvlink-2-hybrid", "ib-hdr", "ib-ndr",
    "eth-25", "eth-100", "roce-200", "roce-400", "host-pcie3", "host-pcie4", "host-pcie5",
]


@pytest.fixture(autouse=True)
def _fresh_catalog(monkeypatch):
    monkeypatch.delenv(hw.CATALOG_ENV, raising=False)
    hw.clear_cache()
    yield
    hw.clear_cache()


def _catalog_files(sub: str, suffix: str):
    d = resources.files("hardware_catalog") / sub
    return sorted((f for f in d.iterdir() if f.name.endswith(suffix)), key=lambda f: f.name)


def _sourced_leaves(obj, path=""):
    """Yield (path, value, source) for every {value, source} mapping in a parsed file."""
    if isinstance(obj, dict):
        if "value" in obj and "source" in obj:
            yield path, obj["value"], obj["source"]
        for k, v in obj.items():
            yield from _sourced_leaves(v, f"{path}.{k}")


# --- catalog files -------------------------------------------------------------------------

def test_required_entries_present():
    cat = hw.catalog()
    assert set(REQUIRED_GPUS) <= set(cat.gpus)
    assert set(REQUIRED_LINKS) <= set(cat.links)
    assert set(REQUIRED_GPUS) <= set(cat.profiles)


@pytest.mark.parametrize("f", _catalog_files("gpus", ".yaml"), ids=lambda f: f.name)
def test_gpu_file_validates_and_is_sourced(f):
    data = yaml.safe_load(f.read_text())
    spec = hw.GPUSpec.model_validate(data)
    assert f.name == f"{spec.id}.yaml"
    leaves = list(_sourced_leaves(data))
    assert len(leaves) >= 6
    for path, value, source in leaves:
        assert isinstance(value, (int, float)) and value > 0, path
        assert source.strip(), f"{f.name}{path} has no source"
    assert spec.usable_memory_gib.value < spec.memory_gib.value


@pytest.mark.parametrize("f", _catalog_files("links", ".yaml"), ids=lambda f: f.name)
def test_link_file_validates_and_is_sourced(f):
    data = yaml.safe_load(f.read_text())
    link = hw.LinkSpec.model_validate(data)
    assert f.name == f"{link.id}.yaml"
    for path, _value, source in _sourced_leaves(data):
        assert source.strip(), f"{f.name}{path} has no source"
    if link.kind == "inter":
        assert link.busbw_gbs.value == pytest.approx(
            link.gbits_per_node / 8 * link.efficiency.value, rel=0.01)


@pytest.mark.parametrize("f", _catalog_files("profiles", ".json"), ids=lambda f: f.name)
def test_profile_file_validates_and_matches_gpu(f):
    prof = parse_profile(json.loads(f.read_text()), origin=f.name)
    gpu = hw.get_gpu(f.name[:-5])
    assert prof.device.gpu_id == gpu.id
    assert prof.device.peak_tflops == {k: v.value for k, v in gpu.peak_tflops.items()}
    assert set(prof.gemm) == set(gpu.peak_tflops)  # an efficiency for every peak the GPU has
    assert prof.provenance.method == "published" and prof.provenance.sources
    assert prof.validation is not None and prof.validation.n > 0  # intervals from validate-published
    for g in prof.gemm.values():
        assert 0 < g.e_max < 1 and g.source.strip()
    for text in (prof.attention.source, prof.memory_bw_eff_source, prof.launch_source,
                 prof.optimizer_source, prof.host_source, prof.cpu_adam_source):
        assert text.strip()
    assert 0.7 < prof.memory_bw_eff < 0.95


def test_default_profile_loader():
    from calibration.from_runs import microbenchmark_profile

    prof = hw.default_profile("a100")
    micro = microbenchmark_profile(prof.device.gpu_id)  # the published starting point of the fit
    assert micro.gemm["bf16"].e_max == pytest.approx(271.2 / 312, abs=0.001)
    assert micro.memory_bw_eff == pytest.approx(0.846, abs=0.001)
    k = prof.fit.parameters["tensor_sustained"].value  # the default is fitted to end-to-end runs
    assert prof.gemm["bf16"].e_max == pytest.approx(micro.gemm["bf16"].e_max * k, abs=0.001)


def test_aliases_unique_across_gpus():
    seen: dict[str, str] = {}
    for gpu in hw.list_gpus():
        for name in [gpu.id, *gpu.aliases]:
            key = hw._norm(name)
            assert seen.setdefault(key, gpu.id) == gpu.id, f"{name!r} names two GPUs"


# --- physics-relevant figures ----------------------------------------------------------------

def test_geforce_dense_fp32_accumulate_peaks():
    assert hw.get_gpu("3090").peak_flops("bf16") == pytest.approx(71e12)  # not 142
    assert hw.get_gpu("4090").peak_flops("bf16") == pytest.approx(165.2e12)  # not 330
    assert hw.get_gpu("3090").consumer and not hw.get_gpu("a6000").consumer


def test_dense_not_sparse_peaks():
    assert hw.get_gpu("h100-sxm").peak_flops("bf16") == pytest.approx(989e12)  # not 1979
    assert hw.get_gpu("a100").peak_flops("bf16") == pytest.approx(312e12)  # not 624
    assert hw.get_gpu("a100").peak_flops("tf32") == pytest.approx(156e12)
    assert hw.get_gpu("a100").peak_flops("fp32") == pytest.approx(19.5e12)


def test_missing_precision_raises():
    v100 = hw.get_gpu("v100")
    assert v100.peak_flops("fp16") == pytest.approx(125e12)
    with pytest.raises(UsageError, match="bf16"):
        v100.peak_flops("bf16")
    assert "tf32" not in v100.peak_tflops


def test_usable_memory_below_label():
    for gpu in hw.list_gpus():
        assert 0.95 * gpu.memory_gib.value < gpu.usable_memory_gib.value < gpu.memory_gib.value
    assert hw.get_gpu("3090").usable_memory_gib.value == pytest.approx(23.5, abs=0.2)


def test_published_link_figures():
    assert hw.get_link("nvswitch-3").busbw_gbs.value == pytest.approx(229.04)
    assert hw.get_link("nvswitch-4").busbw_gbs.value == pytest.approx(367.61)
    assert hw.get_link("pcie4-nop2p").busbw_gbs.value == pytest.approx(12.9)
    assert not hw.get_link("pcie4-nop2p").p2p
    assert hw.get_link("host-pcie5").busbw_gbs.value == pytest.approx(55.43)
    assert hw.get_link("host-pcie4").busbw_gbs.value == pytest.approx(24.33 * 2**30 / 1e9, rel=1e-3)
    assert hw.get_link("nvlink-bridge-3").max_gpus == 2
    assert hw.get_link("ib-hdr").gbits_per_node == 200
    assert hw.get_link("ib-ndr").gbits_per_node == 400


# --- names and aliases ---------------------------------------------------------------------

@pytest.mark.parametrize("name, gid", [
    ("3090", "rtx3090"), ("rtx3090", "rtx3090"), ("RTX-3090", "rtx3090"), ("4090", "rtx4090"),
    ("a6000", "rtx-a6000"), ("a100", "a100-80gb-sxm"), ("A100-40GB", "a100-40gb-sxm"),
    ("a100-80gb", "a100-80gb-sxm"), ("h100", "h100-sxm"), ("h100-sxm", "h100-sxm"),
    ("h100-pcie", "h100-pcie"), ("h200", "h200"), ("L40S", "l40s"), ("a10", "a10"),
    ("v100", "v100-sxm2-32gb"), ("rtx6000-ada", "rtx6000-ada"),
])
def test_aliases_resolve(name, gid):
    assert hw.get_gpu(name).id == gid


def test_unknown_gpu_suggests():
    with pytest.raises(UsageError) as exc:
        hw.get_gpu("3009")
    msg = str(exc.value)
    assert "'3009'" in msg and "did you mean" in msg and "3090" in msg
    assert "\n" not in msg


def test_unknown_link():
    with pytest.raises(UsageError, match="pcie4-p2q"):
        hw.get_link("pcie4-p2q")


# --- cluster parsing -----------------------------------------------------------------------

def test_parse_cluster_forms():
    c = hw.parse_cluster("8x3090")
    assert (c.nodes, c.gpus_per_node, c.n_gpus, c.gpu.id) == (1, 8, 8, "rtx3090")
    assert c.intra.id == "pcie4-nop2p" and c.inter is None and c.host.id == "host-pcie4"
    assert c.describe() == "8 × RTX 3090 24 GB · PCIe 4.0 x16, no peer-to-peer"

    one = hw.parse_cluster("3090")
    assert one.n_gpus == 1

    multi = hw.parse_cluster("2x8xa100-80gb")
    assert (multi.nodes, multi.gpus_per_node, multi.n_gpus) == (2, 8, 16)
    assert multi.intra.id == "nvswitch-3" and multi.inter is not None
    assert multi.inter.id == multi.gpu.default_inter_node_link
    assert "2 nodes" in multi.describe()

    assert hw.parse_cluster(" 4 X A6000 ").intra.id == "pcie4-p2p"
    assert hw.parse_cluster("8xh100").intra.id == "nvswitch-4"
    assert hw.parse_cluster("8xh200").intra.id == "nvswitch-4"
    assert hw.parse_cluster("4xh100-pcie").intra.id == "pcie5-p2p"
    assert hw.parse_cluster("8xv100").intra.id == "nvlink-2-hybrid"
    assert hw.parse_cluster("2xa6000", intra_node="nvlink-bridge-3").intra.id == "nvlink-bridge-3"


def test_inter_node_override():
    c = hw.parse_cluster("2x8xh100", inter_node_gbits=200)
    base = hw.get_link("ib-ndr-x8")
    assert c.inter.gbits_per_node == 200
    assert c.inter.busbw_gbs.value == pytest.approx(200 / 8 * base.efficiency.value)
    assert "200" in c.inter.busbw_gbs.source


@pytest.mark.parametrize("text, kwargs, bad", [
    ("0x3090", {}, "0"),
    ("-2x3090", {}, "-2"),
    ("2x0x3090", {}, "0"),
    ("8x", {}, "8x"),
    ("", {}, "''"),
    ("x", {}, "x"),
    ("8x3009", {}, "3009"),
    ("16x3090", {}, "16"),
    ("4x3090", {"intra_node": "nvlink-bridge-3"}, "4"),
    ("3x3090", {"intra_node": "nvlink-bridge-3"}, "nvlink-bridge-3"),
    ("2x8x3090", {"inter_node_gbits": 0}, "0"),
    ("2x8x3090", {"inter_node_gbits": -100}, "-100"),
    ("2x8x3090", {"inter_node_gbits": float("nan")}, "nan"),
    ("8x3090", {"intra_node": "nvlink9"}, "nvlink9"),
    ("8x3090", {"intra_node": "ib-hdr"}, "ib-hdr"),
])
def test_parse_cluster_errors(text, kwargs, bad):
    with pytest.raises(UsageError) as exc:
        hw.parse_cluster(text, **kwargs)
    msg = str(exc.value)
    assert bad in msg and "\n" not in msg


def test_parse_cluster_did_you_mean():
    with pytest.raises(UsageError, match="did you mean"):
        hw.parse_cluster("8x3009")


def test_too_many_per_node_hints_multi_node():
    with pytest.raises(UsageError, match="2x8x"):
        hw.parse_cluster("16xa100")


# --- user catalog files ----------------------------------------------------------------------

def test_user_catalog_dir(tmp_path, monkeypatch):
    base = yaml.safe_load((resources.files("hardware_catalog") / "gpus" / "rtx3090.yaml").read_text())
    base.update(id="my-gpu", name="Lab GPU 12 GB", short_name="Lab GPU 12 GB", aliases=["labgpu"])
    base["memory_gib"] = {"value": 12.0, "source": "our datasheet"}
    base["usable_memory_gib"] = {"value": 11.6, "source": "our measurement"}
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "my-gpu.yaml").write_text(yaml.safe_dump(base))
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "lab-eth.yaml").write_text(textwrap.dedent("""\
        id: lab-eth
        name: Lab 10 GbE
        kind: inter
        busbw_gbs: {value: 0.9, source: "our nccl-tests"}
        latency_us: {value: 300, source: "our nccl-tests"}
        p2p: false
        gbits_per_node: 10
        efficiency: {value: 0.72, source: "our nccl-tests"}
        """))
    monkeypatch.setenv(hw.CATALOG_ENV, str(tmp_path))
    assert hw.get_gpu("labgpu").id == "my-gpu"
    assert hw.get_link("lab-eth").gbits_per_node == 10
    assert hw.parse_cluster("4xlabgpu").gpu.usable_memory_gib.value == 11.6
    assert hw.get_gpu("3090").id == "rtx3090"  # built-ins still there


def test_user_catalog_bad_file_names_file(tmp_path, monkeypatch):
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "broken.yaml").write_text("id: broken\nname: x\n")
    monkeypatch.setenv(hw.CATALOG_ENV, str(tmp_path))
    with pytest.raises(UsageError, match="broken.yaml"):
        hw.catalog()


def test_user_catalog_dir_missing(tmp_path, monkeypatch):
    monkeypatch.setenv(hw.CATALOG_ENV, str(tmp_path / "nope"))
    with pytest.raises(UsageError, match="nope"):
        hw.catalog()
