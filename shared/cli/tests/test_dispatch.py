"""The dispatcher closes a process group the run left open (a gloo group left to interpreter
shutdown can abort a finished CPU DDP run)."""

import torch.distributed as dist

from papers_cli.dispatch import close_process_group


def test_close_process_group_destroys_an_open_group_and_is_a_no_op_after(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    assert dist.is_initialized()
    close_process_group()
    assert not dist.is_initialized()
    close_process_group()  # nothing open: no error
