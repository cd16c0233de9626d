"""The dispatcher closes a process group the run left open (a gloo group left to interpreter
shutdown can abort a finished CPU DDP run)."""

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
