"""The dispatcher closes a process group the run left open (a gloo group left to interpreter
shutdown can abort a finished CPU DDP run)."""

import json
import subprocess
import sys

import pytest
import torch.distributed as dist

from papers_cli.dispatch import close_process_group
from papers_cli.testing import run_train_test


def test_close_process_group_destroys_an_open_group_and_is_a_no_op_after(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    assert dist.is_initialized()
    close_process_group()
    assert not dist.is_initialized()
    close_process_group()  # nothing open: no error


def test_run_train_test_reports_a_failing_run_with_its_stderr(tmp_path, monkeypatch):
    """A `train test` that fails becomes an assertion carrying its exit status and stderr; one
    that succeeds returns its stdout (a stand-in script replaces the dispatcher)."""
    script = tmp_path / "train"
    script.write_text(
        '#!/bin/sh\necho "args: $*"\n[ "$1" = test ] || exit 0\necho boom >&2\nexit 3\n'
    )
    script.chmod(0o755)
    monkeypatch.setattr("papers_cli.testing.train_script", lambda: script)
    with pytest.raises(AssertionError, match=r"train test failed \(3\):\nboom"):
        run_train_test(tmp_path, ["--x=1"], "a.ckpt")
    ok = tmp_path / "ok"
    ok.write_text('#!/bin/sh\necho "args: $*"\n')
    ok.chmod(0o755)
    monkeypatch.setattr("papers_cli.testing.train_script", lambda: ok)
    assert run_train_test(tmp_path, ["--x=1"], "a.ckpt") == "args: test --x=1 --ckpt_path=a.ckpt\n"


# Runs in a fresh interpreter: times the import and the call (not the interpreter's start, which a
# loaded machine stretches) and reports what got imported.
LIST_PROJECTS = """
import json, sys, time
start = time.perf_counter()
from papers_cli.dispatch import dispatch
code = dispatch(sys.argv[1])
seconds = time.perf_counter() - start
loaded = sorted(m for m in ("torch", "lightning", "papers_cli.lightning_cli") if m in sys.modules)
print(json.dumps({"code": code, "seconds": seconds, "loaded": loaded}))
"""


@pytest.mark.parametrize("command", ["train", "reproduce"])
@pytest.mark.parametrize("where", ["outside_any_workspace", "workspace_root"])
def test_outside_a_project_lists_the_projects_fast_without_importing_torch(
    command, where, tmp_path
):
    """Outside a project the dispatcher only prints the projects: it used to import torch and
    Lightning through papers_cli/__init__ first (12 s of CPU, 118 s wall on a loaded machine)."""
    from papers_cli.projects import registered_projects

    expected = set(registered_projects(f"papers.{command}"))  # empty in papers-cli's own lane
    if where == "workspace_root":
        (tmp_path / "pyproject.toml").write_text("[tool.uv.workspace]\nmembers = ['projects/*']\n")
        for slug in ("alpha-paper", "beta-paper"):
            (tmp_path / "projects" / slug).mkdir(parents=True)
            (tmp_path / "projects" / slug / "pyproject.toml").write_text(
                f"[project]\nname = '{slug}'\n"
            )
        expected |= {"alpha-paper", "beta-paper"}
    result = subprocess.run(
        [sys.executable, "-c", LIST_PROJECTS, command],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(result.stdout)
    assert report["code"] == 2, result.stderr
    listed = {line[4:] for line in result.stderr.splitlines() if line.startswith("  - ")}
    assert listed == expected
    if not expected:
        assert "(none found)" in result.stderr
    assert report["loaded"] == []  # no torch, no lightning, not even the LightningCLI module
    # 0.1-0.2 s measured on 2 shared cores; the bound is generous so that load cannot flake it,
    # and still far below the ~12 s that importing torch and Lightning cost.
    assert report["seconds"] < 3.0


def test_every_public_name_of_the_lazy_package_resolves_to_its_submodule_object():
    import papers_cli
    from papers_cli import errors, hparams, lightning_cli, projects

    for name in papers_cli.__all__:
        owner = next(m for m in (errors, hparams, lightning_cli, projects) if hasattr(m, name))
        assert getattr(papers_cli, name) is getattr(owner, name), name
    assert set(papers_cli.__all__) <= set(dir(papers_cli))
    with pytest.raises(AttributeError, match="no_such_name"):
        papers_cli.no_such_name  # noqa: B018
