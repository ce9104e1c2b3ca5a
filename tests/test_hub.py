"""``--model org/name[@revision]``: presets first, then a fake local Hugging Face cache (the layout
huggingface_hub writes), then a download of config.json only (faked). No test touches the network:
every test runs with HF_HUB_OFFLINE=1 unless it replaces huggingface_hub with a fake."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from simulator.core.errors import UsageError
from simulator.frontends.cli import main
from simulator.model import hub
from simulator.model.presets import get_model
from simulator.model.resolve import resolve_model

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
QWEN = json.loads((FIXTURES / "Qwen2.5-0.5B.json").read_text())
SMALL = json.loads((Path(__file__).parent / "data" / "small_hf_configs.json").read_text())


@pytest.fixture(autouse=True)
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache folder, offline, whatever the machine's environment says."""
    cache = tmp_path / "hub-cache"
    cache.mkdir()
    for var in ("HF_HOME", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def put(cache: Path, repo_id: str, config: dict, revision: str = "main", commit: str = "a" * 40) -> Path:
    """Write ``config`` where huggingface_hub would: refs/<revision> -> snapshots/<commit>/."""
    folder = cache / ("models--" + repo_id.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / revision).write_text(commit)
    snap = folder / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (snap / "config.json").write_text(json.dumps(config))
    return snap / "config.json"


def test_parse_hub_id() -> None:
    assert hub.parse_hub_id("Qwen/Qwen2.5-0.5B") == ("Qwen/Qwen2.5-0.5B", None)
    assert hub.parse_hub_id("EleutherAI/pythia-1b@step1000") == ("EleutherAI/pythia-1b", "step1000")
    assert hub.parse_hub_id("org/name@refs/pr/1") == ("org/name", "refs/pr/1")
    for not_an_id in ("pythia-1b", "a/b/c", "org/config.json", "/abs/path", "org/", "@x"):
        assert hub.parse_hub_id(not_an_id) is None, not_an_id


def test_preset_first(offline_cache: Path) -> None:
    # a cached config that disagrees must not win over the preset with that hf_id
    put(offline_cache, "Qwen/Qwen2.5-0.5B", dict(QWEN, num_hidden_layers=2))
    assert resolve_model("Qwen/Qwen2.5-0.5B") is get_model("qwen2.5-0.5b")
    assert resolve_model("qwen/qwen2.5-0.5b").name == "qwen2.5-0.5b"


def test_from_cache(offline_cache: Path) -> None:
    path = put(offline_cache, "someorg/tiny-qwen", SMALL["small-qwen3"])
    m = resolve_model("someorg/tiny-qwen")
    assert m.family == "qwen3" and m.n_params() == 150_144
    assert (m.name, m.hf_id, m.display_name) == ("tiny-qwen", "someorg/tiny-qwen", "someorg/tiny-qwen")
    assert str(path) in m.source and "local Hugging Face cache" in m.source
    # Hub ids are case-insensitive; the cache folder keeps its case
    assert resolve_model("SomeOrg/Tiny-Qwen").n_params() == 150_144


def test_revisions(offline_cache: Path) -> None:
    put(offline_cache, "someorg/tiny", SMALL["small-olmo"])
    put(offline_cache, "someorg/tiny", SMALL["small-olmo2"], revision="v2", commit="b" * 40)
    assert resolve_model("someorg/tiny").family == "olmo"
    assert resolve_model("someorg/tiny@v2").family == "olmo2"
    assert resolve_model("someorg/tiny@" + "b" * 40).family == "olmo2"  # a commit hash itself
    with pytest.raises(UsageError, match="v3"):
        resolve_model("someorg/tiny@v3")


def test_hf_home_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub.cache_dir() == tmp_path / "hf" / "hub"
    put(tmp_path / "hf" / "hub", "someorg/tiny", SMALL["small-bloom"])
    assert resolve_model("someorg/tiny").family == "bloom"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"


def test_offline_without_cache_is_one_line() -> None:
    with pytest.raises(UsageError) as exc:
        resolve_model("someorg/not-cached@v1")
    msg = str(exc.value)
    assert "\n" not in msg and "'someorg/not-cached@v1'" in msg and "offline" in msg
    assert "hf download someorg/not-cached config.json --revision v1" in msg
    assert "huggingface-cli download" in msg and "path" in msg


def test_offline_hint_names_a_preset_with_that_name() -> None:
    with pytest.raises(UsageError, match="use the preset 'pythia-1b'"):
        resolve_model("myorg/pythia-1b")


def test_not_modelled_from_cache(offline_cache: Path) -> None:
    put(offline_cache, "databricks/dbrx-base", {"model_type": "dbrx", "d_model": 6144})
    with pytest.raises(UsageError, match="mixture-of-experts is not modelled yet"):
        resolve_model("databricks/dbrx-base")


def test_deepseek_v3_from_cache(offline_cache: Path) -> None:
    """A cached DeepSeek-V3 config.json resolves to the modelled family (tests/fixtures/hf_configs)."""
    cfg = Path(__file__).parent / "fixtures" / "hf_configs" / "DeepSeek-V3.json"
    put(offline_cache, "deepseek-ai/DeepSeek-V3", json.loads(cfg.read_text()))
    assert resolve_model("deepseek-ai/DeepSeek-V3").n_params() == 671_026_404_352


def test_cli_offline_and_cached(offline_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--gpus", "8x3090", "--model", "someorg/absent"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "hf download someorg/absent config.json" in err
    put(offline_cache, "someorg/tiny", SMALL["small-gemma2"])
    assert main(["--gpus", "1x3090", "--model", "someorg/tiny", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["feasible"]


def _fake_hub(monkeypatch: pytest.MonkeyPatch, impl) -> list[tuple]:
    calls: list[tuple] = []

    def hf_hub_download(repo_id: str, filename: str, revision: str | None = None) -> str:
        calls.append((repo_id, filename, revision))
        return impl(repo_id, filename, revision)

    module = types.ModuleType("huggingface_hub")
    module.hf_hub_download = hf_hub_download  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "huggingface_hub", module)
    monkeypatch.setattr(hub, "hub_reachable", lambda: True)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    return calls


def test_online_downloads_config_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fetch(repo_id, filename, revision):
        return str(put(tmp_path / "downloaded", repo_id, SMALL["small-phi3"]))

    calls = _fake_hub(monkeypatch, fetch)
    m = resolve_model("microsoft/some-phi@main")
    assert calls == [("microsoft/some-phi", "config.json", "main")]
    assert m.family == "phi3" and "downloaded" in m.source


def test_online_errors_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    class RepositoryNotFoundError(Exception):
        pass

    class GatedRepoError(RepositoryNotFoundError):
        pass

    class ConnectError(Exception):
        pass

    class EntryNotFoundError(Exception):
        pass

    class LocalEntryNotFoundError(EntryNotFoundError):
        pass

    for exc, needle in ((RepositoryNotFoundError("404"), "no such repository"),
                        (GatedRepoError("403"), "gated"),
                        (EntryNotFoundError("no file"), "has no config.json"),
                        (LocalEntryNotFoundError("offline"), "cannot reach the Hugging Face Hub"),
                        (ConnectError("dns"), "cannot reach the Hugging Face Hub")):
        def fail(repo_id, filename, revision, exc=exc):
            raise exc

        _fake_hub(monkeypatch, fail)
        with pytest.raises(UsageError) as info:
            resolve_model("someorg/x")
        assert needle in str(info.value) and "\n" not in str(info.value)
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")


def test_online_without_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    with pytest.raises(UsageError, match=r"pretrain-simulator\[hub\]"):
        resolve_model("someorg/x")


def test_unreachable_hub_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    reachable = hub.hub_reachable
    calls = _fake_hub(monkeypatch, lambda *a: pytest.fail("no download when the Hub is unreachable"))
    monkeypatch.setattr(hub, "hub_reachable", lambda: False)
    with pytest.raises(UsageError, match="unreachable"):
        resolve_model("someorg/x")
    assert calls == []
    monkeypatch.setenv("HF_ENDPOINT", "https://no-such-host.invalid")  # .invalid never resolves
    assert reachable() is False


def test_a_revision_of_a_preset_is_that_revision_not_the_preset(offline_cache: Path) -> None:
    """``org/name@rev`` of a model that has a preset reads that revision's config (the preset is
    the model as published, not a checkpoint's); a revision not in the cache is one line that says so
    and offers the preset, where it had been silently the preset."""
    with pytest.raises(UsageError) as exc:
        resolve_model("Qwen/Qwen2.5-0.5B@badrev")
    assert "badrev" in str(exc.value) and "'qwen2.5-0.5b'" in str(exc.value) and "\n" not in str(exc.value)
    put(offline_cache, "Qwen/Qwen2.5-0.5B", SMALL["small-qwen3"], revision="v1", commit="c" * 40)
    assert resolve_model("Qwen/Qwen2.5-0.5B@v1").family == "qwen3"
    assert resolve_model("Qwen/Qwen2.5-0.5B").name == "qwen2.5-0.5b"
