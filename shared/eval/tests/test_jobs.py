"""The shared job runner (papers_eval.jobs): order, duplicates, worker-count independence, the
resumable cache, progress lines, errors, the Dask path and a light import."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from papers_eval.jobs import (
    ClaimJobs,
    Job,
    JobError,
    job_key,
    quiet_lightning,
    run_jobs,
    runner_options,
    summarise_jobs,
)

HERE = Path(__file__).resolve().parent
# Spawned workers inherit sys.path, so they can import the job functions by name (jobs_fns.py).
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import jobs_fns  # noqa: E402


@pytest.fixture
def marks(tmp_path):
    return {"marks": str(tmp_path / "marks")}


def test_job_name_key_and_hash():
    job = Job("permflow", 0, {"lr": 1e-3}, stage="tune")
    assert job.name == "permflow lr=0.001 seed=0 [tune]"
    assert Job("oracle", 2).name == "oracle seed=2 [test]"
    # The key ignores dict order and tuple-vs-list, and sees everything else.
    same = Job("permflow", 0, {"b": (1, 2), "a": 1})
    assert job_key(same) == job_key(Job("permflow", 0, {"a": 1, "b": [1, 2]}))
    assert same == Job("permflow", 0, {"a": 1, "b": [1, 2]})
    assert hash(same) == hash(Job("permflow", 0, {"a": 1, "b": [1, 2]}))
    assert Job("x", 0, {"lr": 1}) != Job("x", 0, {"lr": 1.0})  # as the cache keys differ
    base = job_key(job, settings={"steps": 3}, revision="abc", label="permflow")
    for other in (
        job_key(Job("permflow", 1, {"lr": 1e-3}, stage="tune"), settings={"steps": 3},
                revision="abc", label="permflow"),
        job_key(Job("permflow", 0, {"lr": 1e-3}, stage="test"), settings={"steps": 3},
                revision="abc", label="permflow"),
        job_key(job, settings={"steps": 4}, revision="abc", label="permflow"),
        job_key(job, settings={"steps": 3}, revision="abd", label="permflow"),
        job_key(job, settings={"steps": 3}, revision="abc", label="other"),
    ):  # fmt: skip
        assert other != base
    with pytest.raises(TypeError, match="not JSON-able"):
        Job("permflow", 0, {"model": object()})
    params = {"lr": 0.1}
    frozen = Job("x", 0, params)
    params["lr"] = 0.2  # the job keeps its own copy
    assert frozen.params == {"lr": 0.1}


def test_results_in_order_and_duplicates_run_once(marks):
    jobs = [Job("a", 2), Job("b", 1, {"scale": 3}), Job("a", 2), Job("a", 0)]
    results = run_jobs(jobs_fns.record_call, jobs, settings=marks, progress=False)
    assert [r.job for r in results] == jobs
    assert [r.value["x"] for r in results] == [2, 3, 2, 0]
    assert jobs_fns.calls(marks) == ["a-test-0", "a-test-2", "b-test-1"]
    assert all(r.wall_time_s >= 0 and r.peak_memory_mb > 0 and not r.cached for r in results)
    assert run_jobs(jobs_fns.record_call, [], settings=marks) == []


def test_worker_count_does_not_change_results(tmp_path):
    jobs = [Job("linear", seed, {"lr": lr}) for seed in (0, 1) for lr in (0.05, 0.2)]
    settings = {"steps": 20}
    here = run_jobs(jobs_fns.sgd, jobs, settings=settings, workers=1, progress=False)
    pool = run_jobs(jobs_fns.sgd, jobs, settings=settings, workers=2, progress=False)
    assert {r.value["threads"] for r in here + pool} == {1}
    assert len({r.value["pid"] for r in pool}) == 2  # really two worker processes
    # One torch thread in both cases, same machine: the same float operations in the same
    # order, so the results are bitwise equal (no tolerance needed).
    for a, b in zip(here, pool, strict=True):
        assert a.job == b.job
        assert a.value["losses"].equal(b.value["losses"])
        for name, tensor in a.value["state"].items():
            assert tensor.equal(b.value["state"][name])
    assert not here[0].value["losses"].equal(here[1].value["losses"])  # lr mattered


@pytest.mark.parametrize("workers", [1, 2])
def test_an_interrupted_run_continues_where_it_stopped(tmp_path, marks, workers):
    fail_file = tmp_path / "fail-once"
    fail_file.touch()
    settings = {**marks, "fail_file": str(fail_file), "fail_seed": 3}
    jobs = [Job("s", seed) for seed in range(6)]
    cache = tmp_path / "jobs"
    kwargs = {"settings": settings, "cache_dir": cache, "progress": False, "workers": workers}
    with pytest.raises(JobError, match=r"s seed=3 \[test\] failed: ValueError: planned") as caught:
        run_jobs(jobs_fns.record_call, jobs, **kwargs)
    assert caught.value.job == Job("s", 3)
    assert isinstance(caught.value.__cause__, ValueError)
    first = jobs_fns.calls(settings)
    assert "s-test-3" in first
    if workers == 1:  # in order: the three before the failure, nothing after it
        assert first == ["s-test-0", "s-test-1", "s-test-2", "s-test-3"]
    fail_file.unlink()
    # The resumed run in this process (a second pool would only cost start-up time).
    results = run_jobs(jobs_fns.record_call, jobs, **{**kwargs, "workers": 1})
    finished = [c for c in first if c != "s-test-3"]  # cached before the failure propagated
    rerun = jobs_fns.calls(settings)
    for call in first:
        rerun.remove(call)
    assert sorted(rerun) == sorted(f"s-test-{s}" for s in range(6) if f"s-test-{s}" not in finished)
    assert [r.value["x"] for r in results] == list(range(6))
    assert [r.cached for r in results] == [f"s-test-{s}" in finished for s in range(6)]


def test_fresh_ignores_the_cache_and_a_new_revision_starts_a_new_one(tmp_path, marks):
    jobs = [Job("s", seed) for seed in range(3)]
    kwargs = {"settings": marks, "cache_dir": tmp_path / "jobs", "progress": False}
    run_jobs(jobs_fns.record_call, jobs, revision="r1", **kwargs)
    again = run_jobs(jobs_fns.record_call, jobs, revision="r1", **kwargs)
    assert all(r.cached for r in again) and len(jobs_fns.calls(marks)) == 3
    fresh = run_jobs(jobs_fns.record_call, jobs, revision="r1", fresh=True, **kwargs)
    assert not any(r.cached for r in fresh) and len(jobs_fns.calls(marks)) == 6
    run_jobs(jobs_fns.record_call, jobs, revision="r2", **kwargs)
    assert len(jobs_fns.calls(marks)) == 9


def test_a_corrupt_or_partial_cache_entry_is_run_again(tmp_path, marks, capsys):
    jobs = [Job("s", seed) for seed in range(4)]
    cache = tmp_path / "jobs"
    kwargs = {"settings": marks, "cache_dir": cache, "progress": False}
    first = run_jobs(jobs_fns.record_call, jobs, **kwargs)
    (cache / f"{first[0].key}.pkl").write_bytes(b"\x80\x05not a pickle")  # corrupt
    (cache / f"{first[1].key}.json").unlink()  # interrupted between the two writes
    (cache / f"{first[2].key}.pkl").write_bytes(b"")  # truncated
    capsys.readouterr()
    again = run_jobs(jobs_fns.record_call, jobs, **kwargs)
    assert [r.cached for r in again] == [False, False, False, True]
    assert [r.value["x"] for r in again] == [0, 1, 2, 3]
    assert "2 unreadable entries run again" in capsys.readouterr().out
    assert all(r.cached for r in run_jobs(jobs_fns.record_call, jobs, **kwargs))
    assert not list(cache.glob(".*.tmp"))  # no temporary file left behind


def test_plain_progress_lines(tmp_path, marks, capsys):
    jobs = [Job("permflow", 0, {"lr": 1e-3}, stage="tune"), Job("oracle", 1)]
    kwargs = {"settings": marks, "cache_dir": tmp_path / "jobs", "label": "demo"}
    run_jobs(jobs_fns.record_call, jobs, progress=False, **kwargs)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4, lines  # start, one per job, end: nothing else
    assert lines[0].startswith("jobs [demo]: 2, 0 cached in ")
    assert lines[0].endswith("2 to run in this process")
    assert lines[1].startswith("[1/2] permflow lr=0.001 seed=0 [tune]: ")
    assert lines[2].startswith("[2/2] oracle seed=1 [test]: ")
    assert lines[3].startswith("jobs done: 2 (2 run, 0 cached) in ")
    run_jobs(jobs_fns.record_call, jobs, progress=None, **kwargs)  # pytest's stdout: no TTY
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4, lines
    assert lines[0].endswith(", 2 cached in " + str(tmp_path / "jobs") + ", nothing to run")
    assert lines[1].startswith("[1/2] permflow lr=0.001 seed=0 [tune]: ")
    assert lines[1].endswith(" (cached)")
    assert lines[3].startswith("jobs done: 2 (0 run, 2 cached)")


def test_the_rich_display_runs(marks, capsys):
    results = run_jobs(jobs_fns.record_call, [Job("s", 0), Job("s", 1)], settings=marks,
                       progress=True)  # fmt: skip
    assert [r.value["x"] for r in results] == [0, 1]
    assert "[2/2] s seed=1 [test]" in capsys.readouterr().out


def test_a_dask_local_cluster_gives_the_same_results(tmp_path, marks, monkeypatch):
    distributed = pytest.importorskip("distributed")
    monkeypatch.setenv("PYTHONPATH", str(HERE))  # the Dask workers import jobs_fns by name
    # Jobs without torch: its import would cost each worker seconds; the pool test above shows
    # one-thread torch results do not depend on the process that computes them.
    jobs = [Job("s", seed, {"scale": 2}) for seed in (3, 1, 2, 1)]
    here = run_jobs(jobs_fns.record_call, jobs, settings=marks, progress=False)
    start = time.perf_counter()
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        cached = tmp_path / "jobs"
        address = cluster.scheduler_address  # as `reproduce --scheduler tcp://...` passes it
        remote = run_jobs(jobs_fns.record_call, jobs, settings=marks, scheduler=address,
                          cache_dir=cached, progress=False)  # fmt: skip
        with distributed.Client(cluster) as client:  # a Client works too, and is left open
            again = run_jobs(jobs_fns.record_call, jobs, settings=marks, scheduler=client,
                             cache_dir=cached, progress=False)  # fmt: skip
            assert client.status == "running"
            pids = set(client.run(os.getpid).values())
        # and the cluster object itself (fresh: run again)
        fresh = run_jobs(jobs_fns.record_call, jobs, settings=marks, scheduler=cluster,
                         cache_dir=cached, fresh=True, progress=False)  # fmt: skip
    print(f"LocalCluster part: {time.perf_counter() - start:.1f} s")
    values = [r.value for r in here]
    assert values == [r.value for r in remote] == [r.value for r in again]
    assert values == [r.value for r in fresh]
    assert [r.job for r in remote] == jobs
    assert not any(r.cached for r in remote + fresh) and all(r.cached for r in again)
    assert len(jobs_fns.calls(marks)) == 3 + 3 + 3  # the duplicate ran once each time
    assert pids.isdisjoint({os.getpid()})


def test_summarise_jobs_is_a_json_record(marks, tmp_path):
    jobs = [Job("a", 0, stage="tune"), Job("a", 1), Job("b", 1), Job("a", 1)]
    kwargs = {"settings": marks, "cache_dir": tmp_path / "jobs", "progress": False}
    run_jobs(jobs_fns.record_call, jobs[:2], **kwargs)
    summary = summarise_jobs(run_jobs(jobs_fns.record_call, jobs, **kwargs))
    json.dumps(summary, allow_nan=False)
    assert (summary["jobs"], summary["ran"], summary["cached"]) == (3, 1, 2)
    assert summary["per_stage"]["tune"]["jobs"] == 1
    assert summary["per_stage"]["test"] == {**summary["per_stage"]["test"], "jobs": 2, "ran": 1}
    assert summary["peak_memory_mb"] > 0
    assert [row["name"] for row in summary["per_job"]] == [
        "a seed=0 [tune]",
        "a seed=1 [test]",
        "b seed=1 [test]",
    ]


def test_runner_options_read_the_shared_flags():
    def args(**kw):
        return argparse.Namespace(**{"jobs": None, "fresh": False, "scheduler": None,
                                     "quick": False, **kw})  # fmt: skip

    assert runner_options(args(), default_workers=2) == {
        "workers": 2,
        "fresh": False,
        "scheduler": None,
    }
    assert runner_options(args(quick=True), default_workers=2)["workers"] == 1
    assert runner_options(args(quick=True, jobs=3), default_workers=2)["workers"] == 3
    options = runner_options(args(fresh=True, scheduler="tcp://h:8786"), default_workers=1)
    assert options == {"workers": 1, "fresh": True, "scheduler": "tcp://h:8786"}
    with pytest.raises(ValueError, match="at least 1"):
        runner_options(args(jobs=0), default_workers=2)


def test_claim_jobs_bind_the_runner_and_keep_every_result(tmp_path, marks):
    args = argparse.Namespace(jobs=None, fresh=False, scheduler=None, quick=True)
    cache = tmp_path / "jobs"
    run = ClaimJobs(jobs_fns.record_call, args=args, settings=marks, cache_dir=cache,
                    revision="r1", label="demo")  # fmt: skip
    assert run.options["workers"] == 1  # --quick without --jobs: in process
    first = run([Job("a", 1), Job("b", 2, {"scale": 5})])
    assert {job.subject: value["x"] for job, value in first.items()} == {"a": 1, "b": 10}
    # A second batch loads the cached job and runs the new one; ``ran`` keeps both batches.
    again = run.results([Job("a", 1), Job("c", 0)])
    assert [r.cached for r in again] == [True, False]
    assert [r.job.subject for r in run.ran] == ["a", "b", "a", "c"]
    assert jobs_fns.calls(marks) == ["a-test-1", "b-test-2", "c-test-0"]
    # Settings given for one batch replace the bound ones for that batch only.
    other = {"marks": str(tmp_path / "other")}
    assert run([Job("d", 3)], other)[Job("d", 3)]["x"] == 3
    assert jobs_fns.calls(other) == ["d-test-3"] and "d-test-3" not in jobs_fns.calls(marks)
    unbound = ClaimJobs(jobs_fns.record_call, args=args, cache_dir=cache, revision="r1",
                        label="demo")  # fmt: skip
    with pytest.raises(ValueError, match="no settings"):
        unbound([Job("a", 1)])


def test_quiet_lightning_silences_banners_and_restores():
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    rank_zero.setLevel(logging.INFO)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_lightning():
            assert not rank_zero.isEnabledFor(logging.INFO)
            warnings.warn("The 'train_dataloader' does not have many workers which may be a "
                          "bottleneck.", UserWarning, stacklevel=1)  # fmt: skip
            warnings.warn("GPU available but not used.", UserWarning, stacklevel=1)
            warnings.warn("a real problem", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["a real problem"]
    assert rank_zero.level == logging.INFO  # restored


def test_a_lightning_fit_in_a_job_prints_no_banner(capfd):
    pytest.importorskip("lightning")  # not a dependency of papers-eval: skipped in its own lane
    results = run_jobs(jobs_fns.lightning_fit, [Job("tiny", 0)], progress=False)
    assert results[0].value == 4
    out = capfd.readouterr()
    assert "GPU available" not in out.err + out.out
    assert "Seed set" not in out.err + out.out
    assert "Tip" not in out.err + out.out
    assert len(out.out.splitlines()) == 3, out.out


def test_importing_the_runner_imports_neither_torch_nor_lightning():
    code = (
        "import sys, papers_eval.jobs; "
        "heavy = {'torch', 'lightning', 'distributed', 'rich'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
