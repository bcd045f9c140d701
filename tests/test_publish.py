"""quantkit publish: only an intact, verified artifact goes out. The Hub is a fake
HfApi at the call boundary: no network."""

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
from fixtures import RECIPES

RECIPE = RECIPES / "int4-w4a16-rtn.yaml"
TOKEN = "hf_secret_token_value"


@pytest.fixture(scope="module")
def built(tiny_llama, tmp_path_factory) -> Path:
    from click.testing import CliRunner

    from quantkit.cli import cli

    root = tmp_path_factory.mktemp("publish")
    with mock.patch.dict(os.environ, {"QUANTKIT_HOME": str(root / "home"), "HF_HUB_OFFLINE": "1"}):
        result = CliRunner().invoke(
            cli, ["convert", str(RECIPE), "--model", str(tiny_llama), "--out", str(root / "art")]
        )
    assert result.exit_code == 0, result.output
    return root / "art"


@pytest.fixture
def artifact(built, tmp_path) -> Path:
    dst = tmp_path / "art"
    shutil.copytree(built, dst, symlinks=True)
    return dst


class FakeHub:
    """Stands in for huggingface_hub.HfApi: `repos` maps repo id -> private flag."""

    def __init__(self, repos=None):
        self.repos, self.calls, self.tokens = dict(repos or {}), [], []

    def __call__(self, token=None):  # HfApi(token=...)
        self.tokens.append(token)
        return self

    def repo_info(self, repo_id, repo_type=None, **kw):
        import httpx
        from huggingface_hub.errors import RepositoryNotFoundError

        self.calls.append(("repo_info", repo_id))
        if repo_id not in self.repos:
            request = httpx.Request("GET", f"https://huggingface.co/api/models/{repo_id}")
            raise RepositoryNotFoundError("404 Repository Not Found", response=httpx.Response(404, request=request))
        return SimpleNamespace(id=repo_id, private=self.repos[repo_id])

    def create_repo(self, repo_id, **kw):
        self.calls.append(("create_repo", repo_id, kw))
        self.repos[repo_id] = kw.get("private", False)

    def create_branch(self, repo_id, **kw):
        self.calls.append(("create_branch", repo_id, kw))

    def upload_folder(self, **kw):
        self.calls.append(("upload_folder", kw))
        return SimpleNamespace(commit_url=f"https://huggingface.co/{kw['repo_id']}/commit/abc")

    def uploaded(self) -> bool:
        return any(c[0] == "upload_folder" for c in self.calls)


@pytest.fixture
def hub(monkeypatch):
    from quantkit.artifacts import publish

    fake = FakeHub()
    monkeypatch.setattr(publish, "HfApi", fake)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return fake


def test_dry_run_lists_the_verified_files(cli, artifact, hub):
    code, out, err, data = cli("publish", str(artifact), "--repo", "me/tiny-int4", "--dry-run", "--json")
    assert code == 0, err
    paths = {f["path"] for f in data["files"]}
    manifest = json.loads((artifact / "quantkit.json").read_text())["files"]
    assert paths == {*manifest, "quantkit.json"} and {"config.json", "model.safetensors", "README.md"} <= paths
    assert "base_model_relation: quantized" in data["card"] and data["integrity"]
    assert TOKEN not in out + err and hub.calls == []  # a dry run contacts nothing


def _flip(a):
    f = a / "model.safetensors"
    data = bytearray(f.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 4096] = b"\xff" * len(data[mid : mid + 4096])
    f.write_bytes(bytes(data))


def _link_file(a):
    real = a.parent / "elsewhere.json"
    shutil.copy(a / "config.json", real)
    (a / "config.json").unlink()
    (a / "config.json").symlink_to(real)  # same bytes, but an upload would follow it out of the artifact


def _meta_edit(fn):
    def edit(a):
        meta = json.loads((a / "quantkit.json").read_text())
        fn(meta)
        (a / "quantkit.json").write_text(json.dumps(meta))

    return edit


TAMPER = {
    "4 KiB of 0xFF in the weights": (_flip, "sha256 differs"),
    "truncated weights": (
        lambda a: (a / "model.safetensors").write_bytes((a / "model.safetensors").read_bytes()[:-1]),
        "bytes",
    ),
    "missing file": (lambda a: (a / "tokenizer.json").unlink(), "missing file tokenizer.json"),
    "extra weight shard": (lambda a: (a / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 64), "extra file"),
    "extra file in a subfolder": (
        lambda a: ((a / "sub").mkdir(), (a / "sub" / "notes.txt").write_text("x")),
        "extra file sub/notes.txt",
    ),
    "symlinked file": (_link_file, "symbolic link"),
    "symlinked folder": (lambda a: (a / "more").symlink_to("/etc"), "symbolic link"),
    "edited card": (lambda a: (a / "README.md").write_text("# trust me\n"), "README.md: "),
    "emptied quantkit.json": (lambda a: (a / "quantkit.json").write_text(""), "damaged"),
    "no manifest": (_meta_edit(lambda m: m.pop("files")), "no integrity manifest"),
    "manifest escaping the folder": (
        _meta_edit(lambda m: m["files"].update({"../x": {"sha256": "0", "bytes": 1}})),
        "not a file inside",
    ),
}


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "upload"])
@pytest.mark.parametrize("kind", list(TAMPER))
def test_tampered_artifact_refused(cli, artifact, hub, kind, dry_run):
    tamper, expect = TAMPER[kind]
    tamper(artifact)
    code, out, err, _ = cli("publish", str(artifact), "--repo", "me/x", *(["--dry-run"] if dry_run else []))
    assert code == 2 and expect in err and len(err.strip().splitlines()) == 1, err
    assert not hub.uploaded() and TOKEN not in out + err


@pytest.mark.parametrize(
    "meta",
    [
        {"verification": {"status": "passed"}},
        {"kind": "quantkit-artifact", "verification": {"status": "passed"}},
        {
            "kind": "quantkit-artifact",
            "verification": {"status": "passed"},
            "files": {"config.json": {"sha256": "x", "bytes": 1}},
        },
    ],
    ids=["flag only", "kind and flag", "manifest without weights"],
)
def test_hand_made_quantkit_json_refused(cli, tiny_llama, tmp_path, hub, meta):
    raw = tmp_path / "raw"
    shutil.copytree(tiny_llama, raw)
    (raw / "README.md").write_text("# a model\n")
    (raw / "quantkit.json").write_text(json.dumps(meta))
    for extra in (["--dry-run"], []):
        code, _, err, _ = cli("publish", str(raw), "--repo", "me/x", *extra)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert not hub.uploaded()


def test_unverified_refused(cli, artifact, hub):
    _meta_edit(lambda m: m["verification"].update(status="failed"))(artifact)
    code, _, err, _ = cli("publish", str(artifact), "--repo", "me/x", "--dry-run")
    assert code == 2 and "unverified" in err


@pytest.mark.parametrize(
    "kl", [float("nan"), float("inf"), None, "0.0", True, 1.0], ids=["nan", "inf", "null", "text", "bool", "over"]
)
def test_a_passed_status_without_a_finite_kl_within_its_threshold_is_unverified(cli, artifact, hub, kl):
    """An artifact of a quantkit whose NaN KL passed holds `"mean_kl": NaN, "status": "passed"`:
    the status alone proves nothing, publish reads the KL. (The manifest does not cover quantkit.json.)"""
    _meta_edit(lambda m: m["verification"].update(mean_kl=kl))(artifact)
    for extra in (["--dry-run"], []):
        code, _, err, _ = cli("publish", str(artifact), "--repo", "me/x", *extra)
        assert code == 2 and "unverified" in err and "mean KL" in err and len(err.strip().splitlines()) == 1, err
    assert not hub.uploaded()


@pytest.mark.parametrize("repo", ["noslash", "me/x/y", "me/bad..name", "me/-x", "me/x.git", "me/with space", "/abs"])
def test_dry_run_checks_the_repo_id_like_the_upload(cli, artifact, hub, repo):
    for extra in (["--dry-run"], []):
        code, _, err, _ = cli("publish", str(artifact), "--repo", repo, *extra)
        assert code == 2 and "--repo" in err and len(err.strip().splitlines()) == 1, err
    assert hub.calls == []


def test_private_refused_for_an_existing_public_repo(cli, artifact, hub):
    hub.repos["me/x"] = False
    code, _, err, _ = cli("publish", str(artifact), "--repo", "me/x", "--private")
    assert code == 2 and "exists and is public" in err and not hub.uploaded()
    assert not any(c[0] == "create_repo" for c in hub.calls)


def test_private_new_repo_is_created_private(cli, artifact, hub):
    code, _, err, data = cli("publish", str(artifact), "--repo", "me/new", "--private", "--revision", "v1", "--json")
    assert code == 0, err
    create = [c for c in hub.calls if c[0] == "create_repo"]
    assert create == [("create_repo", "me/new", {"repo_type": "model", "private": True, "exist_ok": True})]
    upload = next(c[1] for c in hub.calls if c[0] == "upload_folder")
    manifest = json.loads((artifact / "quantkit.json").read_text())["files"]
    assert upload["folder_path"] == str(artifact) and upload["revision"] == "v1" and upload["repo_id"] == "me/new"
    assert sorted(upload["allow_patterns"]) == sorted([*manifest, "quantkit.json"])
    assert data["private"] is True and data["commit_url"].endswith("abc") and hub.tokens == [TOKEN]


def test_existing_repos_are_uploaded_to_without_changing_them(cli, artifact, hub):
    hub.repos.update({"me/priv": True, "me/pub": False})
    for repo, flags in (("me/priv", ["--private"]), ("me/priv", []), ("me/pub", [])):
        code, _, err, data = cli("publish", str(artifact), "--repo", repo, *flags, "--json")
        assert code == 0, err
        assert data["private"] is hub.repos[repo]
    assert not any(c[0] == "create_repo" for c in hub.calls)


def test_token_never_written(artifact, hub, tmp_path):
    from quantkit.artifacts import publish

    publish.publish(artifact, "me/x", api=hub)
    for f in [*artifact.rglob("*"), *artifact.parent.rglob("*")]:
        if f.is_file():
            assert TOKEN.encode() not in f.read_bytes()


def test_without_token(cli, artifact, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    code, _, err, _ = cli("publish", str(artifact), "--repo", "me/x")
    assert code == 2 and "HF_TOKEN" in err


def test_offline_is_clear(cli, artifact, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: like being offline
    code, _, err, _ = cli("publish", str(artifact), "--repo", "me/x")
    assert code == 2 and ("cannot reach" in err or "refused" in err) and "hf_x" not in err


def test_card_base_model_is_a_hub_id_or_absent(artifact):
    from quantkit.artifacts.card import hub_id, render_card

    card = (artifact / "README.md").read_text()  # converted from a local directory
    assert "base_model:" not in card.split("---")[1] and str(artifact.parent.parent) not in card and "/tmp" not in card
    meta = json.loads((artifact / "quantkit.json").read_text())
    for local in ("/home/me/models/llama", "./models/x", "~/x", "models\\x", "C:/x/y", "a/b/c", "org/", "../x"):
        assert hub_id(local) is None, local
        text = render_card({**meta, "base_model": local})
        assert "base_model:" not in text.split("---")[1] and local not in text
    text = render_card({**meta, "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"})
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in text.split("---")[1]


def test_card_update_keeps_the_artifact_publishable(cli, artifact, hub):
    from quantkit.artifacts.card import update_card_results

    bench = {
        "prompt_len": 16,
        "device": "cpu",
        "engine": "eager",
        "ttft_ms": 1.0,
        "tpot_ms": 2.0,
        "predicted_tpot_ms": 1.5,
        "bytes_per_token": 1e6,
        "kernel": "dense",
    }
    update_card_results(artifact, {"bench": bench})
    assert "TPOT (batch 1)" in (artifact / "README.md").read_text()
    code, _, err, _ = cli("publish", str(artifact), "--repo", "me/x", "--dry-run")
    assert code == 0, err
