"""verify/status output for CI: JSON (patchkit.status/1), JUnit XML, GitHub
Actions annotations at the broken anchor; apply --check / --diff."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import libcst as cst
import pytest
from support import ALL_NATIVE, PRIMARY, snapshot

from patchkit import registry
from patchkit.codemods.common.base import ClassCodemod, Finding
from patchkit.registry import Patch, Target
from patchkit.tree import find_tree
from patchkit.verify_output import github_annotation

MHA = "srt/layers/attention/trtllm_mha_backend.py"
HOOK = "trtllm-mha-overlap-hook"


def class_line(path: Path, name: str) -> int:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith(f"class {name}"):
            return number
    raise AssertionError(name)


# --- a synthetic patch upstream "superseded" (JUnit <skipped>) ---------------


class GoneUpstream(ClassCodemod):
    DESCRIPTION = "test: upstream later removed the code this change edits"
    CLASS = "TRTLLMHAAttnBackend"
    REQUIRED_TEXT = (CLASS,)

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        return Finding.superseded(f"{self.CLASS}.old_buffer", "upstream dropped old_buffer")


SUPERSEDED = Patch(
    "test-superseded", "Test: superseded upstream", ("sglang#1",), (), "test only", (Target(MHA, (GoneUpstream,)),)
)


def load_patch(pid: str) -> Patch:
    """One patch from patches/, without loading the others (other patches are
    work in progress elsewhere; these tests are about formats)."""
    import importlib.resources

    text = (importlib.resources.files("patchkit.patches") / f"{pid}.toml").read_text(encoding="utf-8")
    return registry._parse(text, f"{pid}.toml")


@pytest.fixture(autouse=True)
def only_hook(monkeypatch):
    patches = (load_patch(HOOK),)
    monkeypatch.setattr(registry, "all_patches", lambda: patches)
    return patches


@pytest.fixture
def with_superseded(monkeypatch, only_hook):
    monkeypatch.setattr(registry, "all_patches", lambda: (*only_hook, SUPERSEDED))


# --- paths as the user typed the tree --------------------------------------


def tree_at(tmp_path):
    pkg = tmp_path / "sglang"
    (pkg / "srt/layers/attention").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "srt/layers/attention/base_attn_backend.py").write_text("")
    (pkg / "mod.py").write_text("")
    return find_tree(pkg)


def test_paths_as_the_user_typed_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tree = tree_at(tmp_path)
    assert tree.shown_path("mod.py", "sglang") == "sglang/mod.py"
    absolute = str(tmp_path / "sglang")
    assert tree.shown_path("mod.py", absolute) == "sglang/mod.py"  # under the working directory
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert tree.shown_path("mod.py", absolute) == str(tmp_path / "sglang/mod.py")
    assert tree.shown_path("mod.py") == str(tmp_path / "sglang/mod.py")  # default: where the tree was found
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path))
    assert tree.github_path("mod.py", absolute) == "sglang/mod.py"


def test_github_escaping():
    line = github_annotation("error", "50% done\nnext", "a,b:c.py", 3, "t: x")
    assert line == "::error file=a%2Cb%3Ac.py,line=3,title=t%3A x::50%25 done%0Anext"


# --- verify on real trees ----------------------------------------------------

pytestmark_trees = pytest.mark.trees


@pytestmark_trees
@pytest.mark.parametrize(
    "layout, prefix", [("checkout", "t0/python/sglang"), ("python", "t0/python/sglang"), ("package", "t0/sglang")]
)
def test_github_annotation_points_at_anchor(make_tree, cli, monkeypatch, tmp_path, layout, prefix):
    tree = make_tree(PRIMARY, layout)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    result = cli("verify", tree.relative_to(tmp_path), "--format", "github")
    assert result.exit_code == 1
    package = find_tree(tree).package
    line = class_line(package / MHA, "TRTLLMHAAttnBackend")
    errors = [ln for ln in result.output.splitlines() if ln.startswith("::error ")]
    assert len(errors) == 1
    assert errors[0].startswith(f"::error file={prefix}/{MHA},line={line},title=patchkit%3A {HOOK}::")
    assert "not applied" in errors[0]
    assert result.output.rstrip().endswith(f"FAILED ({HOOK})")


@pytestmark_trees
def test_github_missing_anchor_and_workspace(make_tree, cli, monkeypatch, tmp_path):
    # A fork renamed the class the patch anchors on.
    tree = make_tree(PRIMARY, "checkout")
    mha = tree / "python/sglang" / MHA
    mha.write_text(mha.read_text().replace("class TRTLLMHAAttnBackend(", "class ForkMHABackend("))
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tree))
    result = cli("verify", tree, "--format", "github")
    assert result.exit_code == 1
    (error,) = [ln for ln in result.output.splitlines() if ln.startswith("::error ")]
    # The class is gone altogether: a file-level annotation (no line to point at).
    assert error.startswith(f"::error file=python/sglang/{MHA},title=patchkit%3A {HOOK}::")
    assert "missing anchor: TRTLLMHAAttnBackend" in error


@pytestmark_trees
def test_junit(make_tree, cli, with_superseded):
    tree = make_tree(PRIMARY)
    result = cli("verify", tree, "--format", "junit")
    assert result.exit_code == 1
    root = ET.fromstring(result.output)
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert set(cases) == {p.id for p in registry.all_patches()}
    failure = cases[HOOK].find("failure")
    assert failure is not None and failure.get("type") == "absent" and failure.get("message")
    assert f"{MHA}:{class_line(tree / MHA, 'TRTLLMHAAttnBackend')}" in failure.text
    skipped = cases["test-superseded"].find("skipped")
    assert skipped is not None and "upstream dropped old_buffer" in skipped.get("message")
    suite = root.find("testsuite")
    assert suite.get("failures") == "1" and suite.get("skipped") == "1"

    assert cli("apply", tree).exit_code == 0
    result = cli("verify", tree, "--format", "junit")
    assert result.exit_code == 0
    root = ET.fromstring(result.output)
    assert root.find("testsuite").get("failures") == "0"
    assert not list(root.iter("failure"))


@pytestmark_trees
def test_json_is_status_1_and_status_matches_verify(make_tree, cli):
    tree = make_tree(PRIMARY)
    verify = cli("verify", tree, "--format", "json")
    status = cli("status", tree, "--format", "json")
    assert verify.exit_code == 1 and status.exit_code == 0
    doc = json.loads(verify.output)
    assert json.loads(status.output) == {k: v for k, v in doc.items() if k != "audit"}  # verify adds the audit
    assert doc["schema"] == "patchkit.status/1" and doc["ok"] is False
    assert set(doc["tree"]) >= {"path", "package", "layout", "version"}
    assert doc["summary"] == {"total": 1, "ok": 0, "failed": 1, "states": {"absent": 1}}
    (patch,) = doc["patches"]
    assert set(patch) >= {"id", "title", "upstream", "requires", "files", "state", "ok", "reason", "notes", "checks"}
    (check,) = patch["checks"]
    assert check["file"] == MHA and check["state"] == "todo"
    assert check["line"] == class_line(tree / MHA, "TRTLLMHAAttnBackend")
    assert check["path"].endswith(f"sglang/{MHA}")

    cli("apply", tree)
    doc = json.loads(cli("verify", tree, "--format", "json").output)
    assert doc["ok"] is True and doc["patches"][0]["checks"][0]["line"] is None


@pytestmark_trees
def test_native_tree_all_formats_pass(make_tree, cli):
    tree = make_tree(ALL_NATIVE)
    for fmt in ("text", "json", "junit", "github"):
        result = cli("verify", tree, "--format", fmt)
        assert result.exit_code == 0, (fmt, result.output)
        assert "::error" not in result.output and "<failure" not in result.output


@pytestmark_trees
def test_text_verify_names_the_broken_anchor(make_tree, cli):
    tree = make_tree(PRIMARY)
    (tree / MHA).write_text((tree / MHA).read_text().replace("class TRTLLMHAAttnBackend(", "class ForkMHA("))
    result = cli("verify", tree)
    assert result.exit_code == 1
    assert f"{MHA}:" in result.output and "missing: TRTLLMHAAttnBackend" in result.output


# --- apply --check / --diff ----------------------------------------------------


@pytestmark_trees
def test_apply_check_lists_what_would_change(make_tree, cli, monkeypatch, tmp_path):
    tree = make_tree(PRIMARY)
    monkeypatch.chdir(tmp_path)
    before = snapshot(tree)
    result = cli("apply", "t0/sglang", "--check")
    assert result.exit_code == 1
    assert f"would apply: {HOOK}" in result.output
    assert f"would change: t0/sglang/{MHA}" in result.output
    assert "+++ b/" not in result.output
    assert snapshot(tree) == before and not (tree / ".patchkit").exists()

    result = cli("apply", "t0/sglang", "--check", "--diff")
    assert result.exit_code == 1
    assert f"+++ b/python/sglang/{MHA}" in result.output

    quiet = cli("-q", "apply", "t0/sglang", "--check")
    assert quiet.exit_code == 1 and quiet.output == ""
    # -q after the subcommand, as `git commit -q` and `ruff check -q` take it.
    assert (
        cli("apply", "t0/sglang", "--check", "-q").output
        == ""
        == cli("apply", "--quiet", "t0/sglang", "--check").output
    )

    assert cli("apply", "t0/sglang").exit_code == 0
    result = cli("apply", "t0/sglang", "--check")
    assert result.exit_code == 0 and "nothing to apply" in result.output


@pytestmark_trees
def test_apply_diff_prints_what_was_applied(make_tree, cli):
    tree = make_tree(PRIMARY)
    result = cli("apply", tree, "--diff")
    assert result.exit_code == 0
    assert "+    def update_verify_buffers_to_fill_after_draft(" in result.output
    assert cli("diff", tree).output in result.output


# --- the pre-commit hooks ------------------------------------------------------


@pytestmark_trees
def test_pre_commit_hooks_run_on_a_fork_checkout(make_tree, cli, monkeypatch):
    yaml = pytest.importorskip("yaml")
    import shlex

    hooks = {h["id"]: h for h in yaml.safe_load((Path(__file__).parents[2] / ".pre-commit-hooks.yaml").read_text())}
    assert set(hooks) == {"patchkit-verify", "patchkit-apply-check"}
    checkout = make_tree(PRIMARY, "checkout")
    monkeypatch.chdir(checkout)
    for hook in hooks.values():
        assert hook["language"] == "python" and hook["pass_filenames"] is False
        argv = shlex.split(hook["entry"]) + hook["args"]
        assert argv[0] == "patchkit"
        assert cli(*argv[1:]).exit_code == 1, hook["id"]
    assert cli("apply", ".").exit_code == 0
    for hook in hooks.values():
        argv = shlex.split(hook["entry"]) + hook["args"]
        assert cli(*argv[1:]).exit_code == 0, hook["id"]


# --- issue 46: dry run, audit wording, verify's json audit ----------------------


@pytestmark_trees
def test_dry_run_is_worded_as_check_with_a_diffstat(make_tree, cli, monkeypatch, tmp_path):
    tree = make_tree(PRIMARY)
    monkeypatch.chdir(tmp_path)
    dry = cli("apply", "t0/sglang", "--dry-run")
    check = cli("apply", "t0/sglang", "--check")
    assert dry.exit_code == 0 and check.exit_code == 1
    assert f"would apply: {HOOK}" in dry.output.splitlines() and f"would apply: {HOOK}" in check.output.splitlines()
    assert "would be applied:" not in dry.output + check.output
    stat = [line for line in dry.output.splitlines() if "|" in line]
    assert any(line.startswith(f" python/sglang/{MHA} ") for line in stat), dry.output
    assert "+++ b/" not in dry.output and "files changed" in dry.output
    summary = "1 patch(es) would be applied, 1 file(s) would change, 1 would be added"
    assert dry.output.splitlines()[-1] == summary == check.output.splitlines()[-1]
    # A file to add is listed as added, as the summary counts it.
    assert "would add: t0/sglang/srt/_patchkit/manifest.json" in check.output.splitlines()
    assert "would change: t0/sglang/srt/_patchkit" not in check.output
    assert not (tree / ".patchkit").exists()


@pytestmark_trees
def test_audit_on_an_unpatched_tree_says_what_the_patch_will_do(cli, make_tree):
    """Triton opts out through needs-cpu-seq-lens itself: before it is
    applied the audit says so in the future, not as done."""
    tree = make_tree(PRIMARY)
    text = cli("audit", tree).output
    assert "opted out by" not in text
    assert "TritonAttnBackend opts out once needs-cpu-seq-lens is applied" in text, text


@pytestmark_trees
def test_verify_json_carries_the_audit_count(make_tree, cli):
    tree = make_tree(PRIMARY)
    text = cli("verify", tree)
    doc = json.loads(cli("verify", tree, "--format", "json").stdout)
    count = doc["audit"]["problems"]
    assert isinstance(count, int) and f"audit: {count} read(s)" in text.output
    assert "audit" not in json.loads(cli("status", tree, "--format", "json").stdout)
