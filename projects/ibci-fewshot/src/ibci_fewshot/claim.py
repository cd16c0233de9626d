"""The claim experiment (`uv run reproduce`), under the protocol of configs/claim.yaml.

Claim: with 3 calibration sentences per held-out session, a pooled GRU backbone plus a
meta-learned alignment layer decodes with lower WER than (1) session-specific input layers
(the new session's layer fit on the 3 sentences), (2) the same alignment fit by plain gradient
descent, (3) the zero-shot pooled backbone.

Per seed (the seed sets the simulated sessions, initialisation and noise) two backbones are
trained through the real CLI: pooled (stage 1 + stage 2 meta-learning) and session-layer (joint
session layers + stage 2 meta-learning of a new layer, for the 2x2). Every subject then adapts to
each held-out session on its calibration sentences and decodes the session's evaluation
sentences. Subjects:

- ``meta_alignment`` (the method); ``session_layers``, ``gradient_alignment``, ``zero_shot``
  (the checked baselines); ``session_layers_meta`` (2x2: session-layer backbone + meta-learned
  layer), ``full_finetune``, ``restandardise`` (the other baselines);
- ``shuffled_transcripts`` (negative control): the method with calibration transcripts permuted;
- ``many_sentence_alignment`` (positive control): the alignment fit on many extra sentences of
  the held-out session, backbone frozen; ``within_session_oracle`` (positive control): backbone
  and alignment fine-tuned on those many sentences.

Tuning: every tuned subject gets the same 3-value grid of its adaptation knob, scored on the
validation session (the last held-in session, never trained on) of the first seed.
Pre-registered precondition (claim.yaml's `precondition:`, judged first by papers_eval): drift
hurts (the zero-shot WER rises with the days since the last held-in session) and the
within-session oracle decodes well; if it fails, the verdict is `not shown`.

Everything runs as jobs of the shared job runner (``papers_eval.jobs``; ``--jobs`` worker
processes of one torch thread each, finished jobs cached under runs/ibci-fewshot/jobs), in three
rounds: one job per (backbone, seed) training, one per tuning configuration, one per (subject,
seed) evaluation. The trained backbones are the later jobs' shared input: stored under
runs/ibci-fewshot/inputs by a digest of their content, which those jobs name in their params.
Adapting and decoding are deterministic given a backbone, so the numbers do not depend on the
worker count.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ibci_fewshot import baselines
from ibci_fewshot.cli import IbciCLI
from ibci_fewshot.core import parameter_distance, relative_input_change
from ibci_fewshot.data import IbciDataModule, Session, pad_batch
from ibci_fewshot.metrics import Lexicon, per_item_rates, session_rates
from ibci_fewshot.model import IbciModule
from papers_cli import project_dir_of, quiet_fit, reproduce_parser
from papers_eval import judge, load_claim_spec, run_seeds, tune, tuning_grids, write_claim
from papers_eval.jobs import (
    ClaimJobs,
    Job,
    canonical_json,
    summarise_jobs,
)
from papers_eval.record import code_revision

PROJECT = project_dir_of(__file__)
CLAIM_FILE = PROJECT / "configs" / "claim.yaml"
JOBS_DIR = PROJECT.parents[1] / "runs" / "ibci-fewshot" / "jobs"
# Content-addressed (a file's name is the digest of its content), so tests and runs can share it.
INPUTS_DIR = PROJECT.parents[1] / "runs" / "ibci-fewshot" / "inputs"
BACKBONES = ("pooled", "session_layers")
SUBJECTS = (
    "meta_alignment",
    "session_layers",
    "gradient_alignment",
    "zero_shot",
    "session_layers_meta",
    "full_finetune",
    "restandardise",
    "shuffled_transcripts",
    "many_sentence_alignment",
    "within_session_oracle",
)
SWEPT = ("meta_alignment", "session_layers", "gradient_alignment")
METRICS = (
    "test_wer",
    "test_cer",
    "test_wer_lexicon",
    "test_wer_5",
    "test_wer_10",
    "test_wer_30",
    "wer_slope_per_day",
    "wer_last_minus_first_day",
)
PAPER_WER = 0.0741  # the paper's FALCON H2 number: real data, not comparable


def fit(seed: int, settings: dict[str, Any], backbone: str) -> IbciModule | Any:
    """Train one backbone (stage 1 then stage 2) through the real CLI, quietly."""
    overrides = [
        f"--model.backbone={backbone}",
        f"--model.stage1_steps={settings['stage1_steps']}",
        f"--trainer.max_steps={settings['stage1_steps'] + settings['meta_steps']}",
        "--trainer.max_epochs=-1",
        f"--model.alignment={settings['alignment']}",
        f"--model.meta_order={settings['meta_order']}",
        *settings.get("extra_args", []),
    ]
    cli = quiet_fit(
        IbciModule,
        IbciDataModule,
        project_file=__file__,
        seed=seed,
        overrides=overrides,
        cli_class=IbciCLI,
    )
    return cli


def adapt(subject: str, models: dict, session: Session, n_cal: int, params, settings):
    """(module, Adapted) of ``subject`` for ``session`` from its first ``n_cal`` calibration
    sentences (or, for the positive controls, from its many extra sentences)."""
    pooled, layered = models["pooled"], models["session_layers"]
    calibration = pad_batch([(session, session.calibration_indices(n_cal))])
    steps = settings["adapt_steps"]
    if subject in ("many_sentence_alignment", "within_session_oracle"):
        many = (
            session.calibration_indices(n_cal)
            + session.extra_indices(settings["calibration_sweep"][-1])[: settings["n_extra"]]
        )
        batch = pad_batch([(session, many)])
        if subject == "many_sentence_alignment":
            return pooled, baselines.gradient_alignment(
                pooled, batch, params["lr"], settings["many_steps"]
            )
        return pooled, baselines.full_finetune(
            pooled, batch, params["lr"], settings["many_steps"], align=True
        )
    if subject == "meta_alignment":
        return pooled, baselines.meta_alignment(pooled, calibration, params["lr_scale"])
    if subject == "shuffled_transcripts":
        return pooled, baselines.meta_alignment(
            pooled, baselines.shuffled(calibration), params["lr_scale"]
        )
    if subject == "gradient_alignment":
        return pooled, baselines.gradient_alignment(pooled, calibration, params["lr"], steps)
    if subject == "zero_shot":
        return pooled, baselines.zero_shot(pooled, calibration)
    if subject == "full_finetune":
        return pooled, baselines.full_finetune(pooled, calibration, params["lr"], steps)
    if subject == "restandardise":
        everything = pad_batch([(session, list(range(len(session.x))))])
        return pooled, baselines.restandardise(pooled, everything["x"], everything["lengths"])
    if subject == "session_layers":
        return layered, baselines.gradient_alignment(layered, calibration, params["lr"], steps)
    if subject == "session_layers_meta":
        return layered, baselines.meta_alignment(layered, calibration, params["lr_scale"])
    raise ValueError(f"unknown subject {subject}")


def score_sessions(subject, models, sessions, n_cal, params, settings):
    """Per session: (greedy predictions, lexicon predictions, references, diagnostics)."""
    out = []
    for session in sessions:
        module, adapted = adapt(subject, models, session, n_cal, params, settings)
        evaluation = pad_batch([(session, session.eval_indices())])
        references = [session.cues[i] for i in session.eval_indices()]
        greedy = baselines.decode(module, adapted, evaluation)
        lexicon = baselines.decode(module, adapted, evaluation, lexicon=True)
        diagnostics = {}
        if adapted.phi is not None and subject in ("meta_alignment", "gradient_alignment"):
            x = module.smooth(evaluation["x"])
            start = module.start_params() if subject == "meta_alignment" else None
            diagnostics = {
                "relative_input_change": relative_input_change(x, adapted.phi, module.form),
                "distance_from_start": parameter_distance(
                    adapted.phi,
                    {k: v.detach() for k, v in (start or module.zero_shot_params()).items()},
                ),
            }
        out.append((greedy, lexicon, references, diagnostics, session.day))
    return out


def fit_job(job: Job, settings: dict[str, Any]) -> dict[str, Any]:
    """Train the backbone ``job.subject`` on ``job.seed`` (top level: worker processes import
    it by name); return what rebuilds it: the module's and the data's constructor arguments
    and the weights, and the training time."""
    began = time.perf_counter()
    cli = fit(job.seed, settings, job.subject)
    return {
        "model": constructor_args(cli.model.hparams),
        "data": constructor_args(cli.datamodule.hparams),
        "state": cli.model.state_dict(),
        "train_s": time.perf_counter() - began,
    }


def constructor_args(hparams) -> dict[str, Any]:
    """LightningCLI adds private keys (``_instantiator``) to saved hyper-parameters."""
    return {k: v for k, v in dict(hparams).items() if not k.startswith("_")}


def digest(backbone: Mapping[str, Any]) -> str:
    """A sha256 (16 hex digits) of a trained backbone: its constructor arguments, and each
    weight's name, dtype, shape and bytes."""
    h = hashlib.sha256(canonical_json({k: backbone[k] for k in ("model", "data")}).encode())
    for name, tensor in backbone["state"].items():
        t = tensor.detach().cpu().contiguous()
        h.update(f"<{name}>{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def backbone_path(key: str) -> Path:
    return INPUTS_DIR / f"backbone-{key}.pt"


def store_backbone(fitted: Mapping[str, Any]) -> str:
    """Save a trained backbone in ``INPUTS_DIR`` under its digest (once); returns the digest."""
    backbone = {k: fitted[k] for k in ("model", "data", "state")}
    key = digest(backbone)
    path = backbone_path(key)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        torch.save(backbone, partial)
        os.replace(partial, path)
    return key


@functools.lru_cache(maxsize=4)
def load_models(pooled: str, session_layers: str) -> dict[str, Any]:
    """One seed's two stored backbones (eval mode, with the lexicon of their training
    transcripts, as after a fit) and their data; kept per process, as the jobs a worker runs
    often share a seed."""
    models: dict[str, Any] = {}
    for name, key in (("pooled", pooled), ("session_layers", session_layers)):
        backbone = torch.load(backbone_path(key), weights_only=True)
        module = IbciModule(**backbone["model"])
        module.load_state_dict(backbone["state"])
        data = IbciDataModule(**backbone["data"])
        data.setup()
        module.lexicon = Lexicon(data.lexicon_words)  # what the fit's setup builds
        models[name], models["data"] = module.eval(), data
    return models


def tune_job(job: Job, settings: dict[str, Any]) -> float:
    """One tuning configuration: the WER on the validation session (the last held-in one)."""
    models = load_models(**job.params["backbones"])
    scored = score_sessions(
        job.subject,
        models,
        [models["data"].val_session],
        settings["n_calibration"],
        dict(job.params["params"]),
        settings,
    )
    return session_rates(scored[0][0], scored[0][2])[1]


def evaluate_job(job: Job, settings: dict[str, Any]) -> dict[str, Any]:
    """One subject on one seed's held-out sessions: its metrics, the per-session WER, and for
    the swept subjects the calibration sweep; the method's adapted-layer diagnostics and its
    learned meta-state."""
    subject, seed = job.subject, job.seed
    models = load_models(**job.params["backbones"])
    data, params = models["data"], dict(job.params["params"])
    scored = score_sessions(
        subject, models, data.test_sessions, settings["n_calibration"], params, settings
    )
    cer, wer = per_item_rates([(g, r) for g, _, r, _, _ in scored])
    _, wer_lexicon = per_item_rates([(lx, r) for _, lx, r, _, _ in scored])
    per_session = [(day, session_rates(g, r)[1]) for g, _, r, _, day in scored]
    slope, last_minus_first = drift_trend(per_session)
    out: dict[str, Any] = {"per_session": per_session, "sweep": []}  # sweep: (n, WER) pairs
    if subject == "meta_alignment":
        out["diagnostics"] = [d for *_, d, _ in scored]
        pooled = models["pooled"]
        out["learned"] = {
            "seed": seed,
            "inner_step_sizes": {k: float(v.detach().exp()) for k, v in pooled.log_step.items()},
            "inner_step_size_start": pooled.hparams.inner_lr,
            "phi0_distance_from_identity": parameter_distance(
                {k: v.detach() for k, v in pooled.phi0.items()},
                pooled.zero_shot_params(),
            ),
        }
    result = {
        "test_wer": wer,
        "test_cer": cer,
        "test_wer_lexicon": wer_lexicon,
        "wer_slope_per_day": slope,
        "wer_last_minus_first_day": last_minus_first,
    }
    if subject in SWEPT:
        out["sweep"].append((settings["n_calibration"], float(wer.mean())))
        for n in settings["calibration_sweep"]:
            rows = score_sessions(subject, models, data.test_sessions, n, params, settings)
            value = float(per_item_rates([(g, r) for g, _, r, _, _ in rows])[1].mean())
            result[f"test_wer_{n}"] = value
            out["sweep"].append((n, value))
    out["result"] = result
    return out


# Each job's stage names the function that runs it.
STAGES = {"fit": fit_job, "tune": tune_job, "test": evaluate_job}


def claim_job(job: Job, settings: dict[str, Any]) -> Any:
    """One job of the shared runner (top level: worker processes import it by name)."""
    return STAGES[job.stage](job, settings)


def run_claim_experiment(argv: list[str] | None = None) -> dict[str, Any]:
    """Tune on validation, run every subject on every seed, judge, write results/."""
    parser = reproduce_parser(__doc__.splitlines()[0], project_file=__file__)
    args = parser.parse_args(argv)  # --jobs (default 2, the 2 cores; 1 with --quick), --fresh
    spec = load_claim_spec(CLAIM_FILE, subjects=SUBJECTS, metrics=METRICS, args=args)
    start = time.perf_counter()
    settings = dict(spec.settings)
    run = ClaimJobs(claim_job, args=args, settings=settings, cache_dir=JOBS_DIR,
                    revision=code_revision(PROJECT), label="ibci-fewshot")  # fmt: skip

    # ---- the backbones, stored for the later jobs
    fits = {(b, seed): Job(b, seed, {}, "fit") for seed in spec.seeds for b in BACKBONES}
    fitted = run(list(fits.values()))
    backbones = {
        seed: {b: store_backbone(fitted[fits[b, seed]]) for b in BACKBONES} for seed in spec.seeds
    }
    train_times = {b: [fitted[fits[b, seed]]["train_s"] for seed in spec.seeds] for b in BACKBONES}

    # ---- tuning on the first seed's validation session
    first = spec.seeds[0]

    def tuning_job(subject: str, params: dict[str, Any]) -> Job:
        return Job(subject, first, {"params": params, "backbones": backbones[first]}, "tune")

    grids = {s: g for s, g in tuning_grids(spec.tuning, spec.subjects).items() if g != [{}]}
    scored = run([tuning_job(s, p) for s, grid in grids.items() for p in grid])
    tuning = tune(spec, lambda subject, params, seed: scored[tuning_job(subject, params)])

    # ---- every subject on every seed's held-out sessions
    def test_run(subject: str, seed: int) -> Job:
        params = tuning.best.get(subject, {})
        return Job(subject, seed, {"params": params, "backbones": backbones[seed]}, "test")

    done = run([test_run(s, seed) for seed in spec.seeds for s in spec.subjects])
    per_session: dict[str, dict[int, list[tuple[int, float]]]] = {}
    diagnostics: list[dict] = []
    sweep: dict[str, dict[int, list[float]]] = {s: {} for s in SWEPT}
    learned: list[dict] = []

    def run_one(subject: str, seed: int) -> dict[str, Any]:
        # in run_seeds' order (seed, then subject), the order the evidence was always kept in
        out = done[test_run(subject, seed)]
        per_session.setdefault(subject, {})[seed] = out["per_session"]
        if subject == "meta_alignment":
            diagnostics.extend(out["diagnostics"])
            learned.append(out["learned"])
        for n, value in out["sweep"]:
            sweep[subject].setdefault(n, []).append(value)
        return out["result"]

    results = run_seeds(spec, run_one)
    judgement = judge(spec, results)
    figures = plot(args.out, per_session, sweep, settings)
    pre_text = "precondition met" if judgement.precondition_met else "PRECONDITION NOT MET"
    means = {s: float(np.mean([np.mean(v) for v in results[s]["test_wer"]])) for s in SUBJECTS}
    headline = (
        f"{pre_text}; 3-sentence WER: meta {means['meta_alignment']:.3f}, session layers "
        f"{means['session_layers']:.3f}, plain-gradient {means['gradient_alignment']:.3f}, "
        f"zero-shot {means['zero_shot']:.3f}, oracle {means['within_session_oracle']:.3f} "
        "(simulation; the paper's 7.41% is real FALCON H2, not comparable)"
    )
    evidence = {
        "adapted_layer": _mean_dicts(diagnostics),
        "learned_meta_state": learned,
        "calibration_sweep_wer": {
            s: {n: float(np.mean(v)) for n, v in d.items()} for s, d in sweep.items()
        },
        "per_session_wer": {
            s: {str(seed): rows for seed, rows in d.items()} for s, d in per_session.items()
        },
        "train_time_s": {k: float(np.mean(v)) for k, v in train_times.items() if v},
        "paper_wer_not_comparable": PAPER_WER,
    }
    notes = " ".join(
        [
            "All data are SIMULATED (simulate.py) and written as FALCON-H2-format NWB files, read "
            "back by the real loader; the paper's 7.41% WER (real FALCON H2, unknown language "
            "model) is not comparable.",
            "Greedy CTC decoding is checked; test_wer_lexicon (nearest training-vocabulary word) "
            "is "
            "reported beside it as a cheap language-model stand-in.",
        ]
    )
    write_claim(
        args.out,
        project="ibci-fewshot",
        spec=spec,
        results=results,
        judgement=judgement,
        config={"settings": settings, "quick": args.quick},
        wall_time_s=time.perf_counter() - start,
        tuning=tuning,
        evidence=evidence,
        headline=headline,
        notes=notes,
        figures=figures,
        jobs=summarise_jobs(run.ran),
    )
    return {"verdict": judgement.verdict, "results": results}


def drift_trend(rows: list[tuple[int, float]]) -> tuple[float, float]:
    """How one subject's session WER moves with days on one seed: the least-squares slope per
    day and the latest session's WER minus the earliest's (the precondition's two drift terms;
    the days are the same on every seed, so their means over seeds equal the pooled values)."""
    days, wers = np.array([d for d, _ in rows], float), np.array([w for _, w in rows])
    slope = float(np.polyfit(days, wers, 1)[0]) if len(set(days)) > 1 else float("nan")
    return slope, float(wers[days == days.max()].mean() - wers[days == days.min()].mean())


def _mean_dicts(rows: list[dict]) -> dict[str, float]:
    keys = {k for r in rows for k in r}
    return {k: float(np.mean([r[k] for r in rows if k in r])) for k in sorted(keys)}


def plot(out: Path, per_session: dict, sweep: dict, settings: dict) -> list[str]:
    """Error rate vs calibration size and vs days; the paper's number as a labelled line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for subject, by_n in sweep.items():
        ns = sorted(by_n)
        left.plot(ns, [np.mean(by_n[n]) for n in ns], marker="o", label=subject)
    left.axhline(PAPER_WER, color="grey", ls=":", label="paper 7.41% (real data, not comparable)")
    left.set(
        xscale="log", xlabel="calibration sentences", ylabel="WER (greedy)", title="vs calibration"
    )
    left.legend(fontsize=7)
    for subject in ("zero_shot", "meta_alignment", "session_layers", "within_session_oracle"):
        rows = [r for seed_rows in per_session.get(subject, {}).values() for r in seed_rows]
        days = sorted({d for d, _ in rows})
        right.plot(
            days,
            [np.mean([w for d, w in rows if d == day]) for day in days],
            marker="o",
            label=subject,
        )
    right.set(
        xlabel="days since the first held-in session",
        ylabel="WER (greedy, 3 sentences)",
        title="vs days",
    )
    right.legend(fontsize=7)
    fig.suptitle("ibci-fewshot: SIMULATED FALCON-H2-format data", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "claim.png", dpi=110)
    plt.close(fig)
    return ["claim.png"]


def main() -> None:
    """Console entry point of `uv run reproduce` (entry point group papers.reproduce)."""
    run_claim_experiment()
