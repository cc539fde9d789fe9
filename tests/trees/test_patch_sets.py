"""Patch sets outside patchkit (examples/acme-patches): loaded from a folder
on the command line, from a pyproject.toml, and from an installed entry point;
ids never collide."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support import PRIMARY, pristine_snapshot, snapshot

from patchkit import registry
from patchkit.state import vendoring

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "acme-patches"
SET = EXAMPLE / "acme_patches"
PATCH = "acme-torch-native-spec-v2"
HELPER = "srt/_patchkit/acme_runtime.py"  # the set's runtime module, vendored into the tree


def one_line_error(result, *needles) -> None:
    out = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(out) == 1 and out[0].startswith("patchkit: error: "), result.output
    for needle in needles:
        assert needle in out[0], out[0]


def test_the_example_stays_short():
    """What a vendor copies: definition and codemods under 100 lines, the test under 60."""
    lines = [
        len(f.read_text().splitlines())
        for f in (
            SET / "torch-native-spec-v2.toml",
            SET / "torch_native.py",
            EXAMPLE / "tests" / "test_acme_patches.py",
        )
    ]
    assert lines[0] + lines[1] < 100 and lines[2] < 60, lines


def test_folder_on_the_command_line(cli):
    listed = cli("--patches", SET, "list").output
    assert f"{PATCH}  " in listed and f"[from {SET}]" in listed
    assert "needs-cpu-seq-lens" in listed  # next to patchkit's own
    assert PATCH not in cli("list").output  # and only when named
    assert f'"origin": "{SET}"' in cli("--patches", SET, "list", "--format", "json").output


def test_pyproject_of_the_trees_repository_names_the_set(make_tree, cli, monkeypatch, tmp_path):
    fork = make_tree(PRIMARY, "checkout")
    shutil.copytree(SET, fork / "acme")
    (fork / "pyproject.toml").write_text('[tool.patchkit]\npatches = ["acme"]\n')
    monkeypatch.chdir(tmp_path)  # outside the fork: found from the TREE
    # A folder is no installed package: package mode has nothing to import the helper from.
    one_line_error(
        cli("apply", fork, PATCH, "--runtime", "package"),
        f"needs runtime module acme_runtime of the patch set folder {fork / 'acme'}",
        "install the set as a distribution",
        "--runtime vendored",
    )
    assert cli("apply", fork, PATCH).exit_code == 0
    package = fork / "python" / "sglang"
    helper = package / HELPER
    assert helper.read_text().endswith((SET / "acme_runtime.py").read_text())  # vendored, with patchkit's header
    assert HELPER in (package / "srt/_patchkit/manifest.json").read_text()  # with its sha256
    monkeypatch.chdir(package / "srt")  # inside it, no TREE: found from here
    # Read commands do not load it (issue 68): they say it is there, and how to load it.
    named = f"--patches {fork / 'acme'}"
    assert f"note: {fork / 'pyproject.toml'} names patch sets" in cli("status").output
    assert named in cli("status").output
    assert [PATCH, "applied"] in [line.split() for line in cli(*named.split(), "status").output.splitlines()]
    vendored = helper.read_bytes()
    helper.write_bytes(vendored.replace(b"!= 2", b"!= 3"))
    edited = cli(*named.split(), "verify", PATCH)
    assert edited.exit_code == 1 and f"{HELPER}: edited after patchkit wrote it" in edited.output, edited.output
    helper.write_bytes(vendored)
    assert cli(*named.split(), "verify", PATCH).exit_code == 0
    assert cli("revert").exit_code == 0
    assert snapshot(fork / "python" / "sglang") == pristine_snapshot(PRIMARY)


def _install_by_hand(target: Path) -> None:
    """What `pip install --target` of examples/acme-patches leaves: the package
    and a dist-info whose entry points are those its pyproject declares."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    shutil.copytree(SET, target / "acme_patches")
    info = target / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    points = project["entry-points"]["patchkit.patches"]
    (info / "entry_points.txt").write_text("[patchkit.patches]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()))


def test_installed_entry_point(make_tree, tmp_path):
    site = tmp_path / "site"
    _install_by_hand(site)
    tree = make_tree(PRIMARY)

    def patchkit(*args):
        code = "import sys; sys.path.insert(0, sys.argv[1]); from patchkit.cli import main; main(sys.argv[2:])"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        return subprocess.run(
            [sys.executable, "-c", code, str(site), *map(str, args)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
        )

    assert "[from acme (entry point of acme-sglang-patches)]" in patchkit("list").stdout
    applied = patchkit("apply", tree, PATCH)
    assert applied.returncode == 0, applied.stderr
    assert (tree / HELPER).read_text().endswith((SET / "acme_runtime.py").read_text())  # read from the package
    assert patchkit("verify", tree, PATCH).returncode == 0
    assert patchkit("revert", tree).returncode == 0
    assert snapshot(tree) == pristine_snapshot(PRIMARY)
    # Package mode: the helper is imported from the installed set, or says what to install.
    assert patchkit("apply", tree, PATCH, "--runtime", "package").returncode == 0
    assert "from acme_patches.acme_runtime import *" in (tree / HELPER).read_text()
    assert patchkit("verify", tree, PATCH).returncode == 0
    assert vendoring.import_in_isolation(tree, str(site)) == (True, "")
    ok, error = vendoring.import_in_isolation(tree)
    assert not ok and "needs acme_patches.acme_runtime, which is not installed: install acme-sglang-patches" in error
    assert patchkit("revert", tree).returncode == 0
    assert snapshot(tree) == pristine_snapshot(PRIMARY)
    # The same set named as a folder too (the files the install copied): one set,
    # named by its entry point; every command works.
    twice = patchkit("--patches", SET, "list")
    assert twice.returncode == 0 and twice.stderr == "", twice.stderr
    assert [line.split()[0] for line in twice.stdout.splitlines()].count(PATCH) == 1
    assert "[from acme (entry point of acme-sglang-patches)]" in twice.stdout
    assert patchkit("--patches", SET, "--help").returncode == 0
    assert patchkit("--patches", site / "acme_patches", "status", tree).returncode == 0


def test_one_set_reached_twice_is_one_set(cli, make_tree, tmp_path):
    """The same folder by --patches and a pyproject, or twice by --patches
    (spelled two ways), or a copy of the same files: one set, no clash."""
    copy = tmp_path / "copy"
    shutil.copytree(SET, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for extra in (
        ["--patches", SET],
        ["--patches", f"{SET}/", "--patches", SET / ".." / SET.name],
        ["--patches", SET, "--patches", copy],
    ):
        listed = cli(*extra, "list")
        assert listed.exit_code == 0 and "warning" not in listed.output, (extra, listed.output)
        assert [line.split()[0] for line in listed.output.splitlines()].count(PATCH) == 1
    fork = make_tree(PRIMARY, "checkout")
    shutil.copytree(SET, fork / "acme")
    (fork / "pyproject.toml").write_text('[tool.patchkit]\npatches = ["acme"]\n')
    applied = cli("--patches", copy, "--patches", fork / "acme", "apply", fork, PATCH)
    assert applied.exit_code == 0 and "warning" not in applied.output, applied.output
    assert cli("revert", fork).exit_code == 0
    assert snapshot(fork / "python" / "sglang") == pristine_snapshot(PRIMARY)


def test_a_command_leaves_no_set_loaded_behind(cli):
    """In-process commands (tests, a Python host) give the registry back: a later
    library call (``matrix.run_matrix``, say) sees only patchkit's own set."""
    assert PATCH in cli("--patches", SET, "list").output
    assert PATCH not in {p.id for p in registry.all_patches()}


def test_id_collision_and_bad_sets_are_one_line(cli, tmp_path, make_tree):
    clash = tmp_path / "clash"
    clash.mkdir()
    for module in ("torch_native.py", "acme_runtime.py", "checks.py"):
        shutil.copy(SET / module, clash)
    text = (SET / "torch-native-spec-v2.toml").read_text()
    (clash / "mine.toml").write_text(text.replace(f'id = "{PATCH}"', 'id = "needs-cpu-seq-lens"'))
    twice = (
        "patch needs-cpu-seq-lens is defined twice, by two different patch sets: in "
        f"patches/needs-cpu-seq-lens.toml and in {clash / 'mine.toml'}"
    )
    for command in (["status", make_tree(PRIMARY)], ["show", "fa3-spec-v2"], ["apply", make_tree(PRIMARY)]):
        one_line_error(cli("--patches", clash, *command), twice)
    listed = cli("--patches", clash, "list")  # list shows the clash, and --help works
    assert listed.exit_code == 0 and f"patchkit: warning: {twice}" in listed.output
    assert [line.split()[0] for line in listed.output.splitlines()].count("needs-cpu-seq-lens") == 2
    assert cli("--patches", clash, "--help").exit_code == 0
    assert cli("--patches", clash, "apply", "--help").exit_code == 0
    (clash / "mine.toml").write_text(text.replace("torch_native:", "nowhere:"))
    one_line_error(cli("--patches", clash, "list"), "codemod nowhere:AddVerifyBuffersHook cannot be loaded", str(clash))
    # Runtime modules: patchkit's own or the set's; one name, one set.
    (clash / "mine.toml").write_text(text.replace('"acme_runtime"', '"nowhere"'))
    one_line_error(
        cli("--patches", clash, "list"),
        "runtime module 'nowhere' is neither one of patchkit's",
        f"nor a module of {clash}",
    )
    (clash / "mine.toml").write_text(text.replace(f'id = "{PATCH}"', 'id = "mine"'))
    one_line_error(
        cli("--patches", SET, "--patches", clash, "show", "mine"),
        f"runtime module acme_runtime is defined twice: in {SET} and in {clash}",
        "sglang.srt._patchkit.acme_runtime",
    )
    shutil.copy(SET / "acme_runtime.py", clash / "runtime.py")
    (clash / "mine.toml").write_text(text.replace('"acme_runtime"', '"runtime"'))
    one_line_error(cli("--patches", clash, "list"), f"{clash} has a module 'runtime', the name of patchkit's own")
    (clash / "mine.toml").write_text("id = [")
    one_line_error(cli("--patches", clash, "list"), "mine.toml: not valid TOML")
    one_line_error(cli("--patches", tmp_path / "nope", "list"), "no such folder of patch definitions")


@pytest.mark.parametrize("config", ['[tool.patchkit]\npatches = "acme"\n', "[tool.patchkit]\npatches = [1]\n"])
def test_pyproject_patches_must_name_folders(cli, make_tree, config):
    fork = make_tree(PRIMARY, "checkout")
    (fork / "pyproject.toml").write_text(config)
    result = cli("apply", fork)
    if '"acme"' in config:  # one folder as a string is accepted, and must exist
        one_line_error(result, "no such folder of patch definitions")
    else:
        one_line_error(result, "[tool.patchkit] patches must be a list of folders")
        status = cli("status", fork)  # a read command loads no config: a note, not an error
        assert status.exit_code == 0 and "note: " in status.output and "must be a list" in status.output


def test_a_tree_patched_from_a_set_not_loaded_now(make_tree, cli):
    tree = make_tree(PRIMARY)
    assert cli("--patches", SET, "apply", tree, PATCH).exit_code == 0
    before = snapshot(tree)
    status = cli("status", tree)
    assert (
        status.exit_code == 0
        and f"note: {PATCH}: applied to this tree from a patch set that is not loaded" in status.output
    )
    for verb in ("revert", "apply"):  # both rebuild files with every patch on the tree: refused
        one_line_error(
            cli(verb, tree), f"{PATCH}: applied to this tree from a patch set that is not loaded", "nothing was changed"
        )
    assert snapshot(tree) == before
    assert cli("--patches", SET, "revert", tree).exit_code == 0
    assert snapshot(tree) == pristine_snapshot(PRIMARY)


@pytest.mark.parametrize("method", ["detect_in_method", "transform_method"])
def test_a_codemod_that_raises_is_one_line(cli, linked_tree, tmp_path, method):
    """A patch set's codemod that raises was a traceback; now one line naming
    it and the file, nothing changed (as a postcondition that raises)."""
    broken = tmp_path / "broken"
    shutil.copytree(SET, broken, ignore=shutil.ignore_patterns("__pycache__"))
    module = broken / "torch_native.py"
    text = module.read_text()
    head = f"    def {method}(self, fn: cst.FunctionDef)"
    at = text.index("\n", text.index(head)) + 1
    module.write_text(text[:at] + '        raise KeyError("boom")\n' + text[at:])
    tree = linked_tree(PRIMARY)
    before = snapshot(tree)
    one_line_error(
        cli("--patches", broken, "apply", tree, PATCH),
        "torch_native.GuardDecodeReshape",
        "on srt/layers/attention/torch_native_backend.py failed to run: KeyError: 'boom'; nothing was changed",
    )
    assert snapshot(tree) == before
