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
- ``many_sentence_alignment`` (positive control, oracle): the alignment fit on many extra
  sentences of the held-out session, backbone frozen; ``many_sentence_finetune`` (positive
  control, oracle): backbone and alignment fine-tuned (30 Adam steps) on those many sentences.

Tuning: every tuned subject gets the same grid width of its adaptation knob, scored on the
validation sessions (the last held-in sessions, never trained on, adapted like held-out ones) of
the first seed; ``--replicate`` keeps those choices on the replication seeds.
Pre-registered precondition (claim.yaml's `precondition:`, judged first by papers_eval): drift
hurts (the zero-shot WER rises with the days since the last held-in session), the meta-learned
start phi_0 is no worse than the identity on the validation sessions, and the many-sentence
fine-tune decodes well; if it fails, the verdict is `not shown`. When the method fails a check,
the budget evidence (the method at 1x and 2x meta-steps on the first seed) and a diagnosis
(``diagnose``) go into the record.

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
from ibci_fewshot.core import change_norms, relative_input_change
from ibci_fewshot.data import IbciDataModule, Session, pad_batch
from ibci_fewshot.metrics import Lexicon, per_item_rates, session_rates
from ibci_fewshot.model import IbciModule
from papers_cli import project_dir_of, quiet_fit, reproduce_parser
from papers_eval import (
    grid_edges,
    judge,
    load_claim_spec,
    run_seeds,
    tune,
    tuning_grids,
    write_claim,
)
from papers_eval.claim_record import Replication
from papers_eval.diagnosis import control_findings, finding
from papers_eval.jobs import (
    ClaimJobs,
    Job,
    canonical_json,
    summarise_jobs,
)
from papers_eval.mechanism import budget_evidence
from papers_eval.record import code_revision

PROJECT = project_dir_of(__file__)
CLAIM_FILE = PROJECT / "configs" / "claim.yaml"
JOBS_DIR = PROJECT.parents[1] / "runs" / "ibci-fewshot" / "jobs"
# Content-addressed (a file's name is the digest of its content), so tests and runs can share it.
INPUTS_DIR = PROJECT.parents[1] / "runs" / "ibci-fewshot" / "inputs"
# Four backbones per seed. The meta-learning subjects read a backbone whose stage 1 saw the
# earlier training sessions and whose stage 2 meta-learned on the later ones (settings'
# meta_sessions: episodes with the recordings' own across-day drift); every other subject reads
# a backbone whose stage 1 saw every training session (no stage 2), so that no subject is
# handicapped by the data the meta-learner set aside.
BACKBONES = ("pooled", "session_layers", "pooled_meta", "session_layers_meta")
BACKBONE_OF = {
    "meta_alignment": "pooled_meta",
    "shuffled_transcripts": "pooled_meta",
    "session_layers_meta": "session_layers_meta",
    "session_layers": "session_layers",
    # plain-gradient alignment on the method's own backbone: separates what meta-learning buys
    # from what setting sessions aside for it costs
    "gradient_alignment_same_backbone": "pooled_meta",
}  # every other subject: "pooled"
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
    "many_sentence_finetune",
    "gradient_alignment_same_backbone",
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
    "val_start_minus_identity_wer",
)
PAPER_WER = 0.0741  # the paper's FALCON H2 number: real data, not comparable


def fit(seed: int, settings: dict[str, Any], backbone: str) -> IbciModule | Any:
    """Train one backbone through the real CLI, quietly: stage 1 on every training session
    (``pooled``, ``session_layers``), or stage 1 on the earlier ones then stage 2 on the latest
    ``meta_sessions`` (``*_meta``)."""
    meta = backbone.endswith("_meta")
    meta_steps = settings["meta_steps"] if meta else 0
    overrides = [
        f"--model.backbone={backbone.removesuffix('_meta')}",
        f"--data.meta_sessions={settings['meta_sessions'] if meta else 0}",
        f"--model.stage1_steps={settings['stage1_steps']}",
        f"--trainer.max_steps={settings['stage1_steps'] + meta_steps}",
        *settings.get("model_args", []),
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
    pooled = models[BACKBONE_OF.get(subject, "pooled")]
    layered = models[BACKBONE_OF.get(subject, "session_layers")]
    calibration = pad_batch([(session, session.calibration_indices(n_cal))])
    steps = settings["adapt_steps"]
    if subject in ("many_sentence_alignment", "many_sentence_finetune"):
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
    if subject in ("gradient_alignment", "gradient_alignment_same_backbone"):
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
            diagnostics = adaptation_diagnostics(
                subject, module, session, n_cal, adapted, evaluation
            )
        out.append((greedy, lexicon, references, diagnostics, session.day))
    return out


def adaptation_diagnostics(subject, module, session, n_cal, adapted, evaluation) -> dict:
    """What adaptation did on one session: how much the adapted layer changes its input, how far
    each tensor moved from its start (||dW||_F and ||db||, free of the identity's norm), and the
    calibration CTC before and after."""
    start = module.start_params() if subject == "meta_alignment" else module.zero_shot_params()
    start = {k: v.detach() for k, v in start.items()}
    calibration = pad_batch([(session, session.calibration_indices(n_cal))])
    x = module.smooth(evaluation["x"])
    with torch.no_grad():
        before, after = (float(module.loss(calibration, phi)) for phi in (start, adapted.phi))
    return {
        "relative_input_change": relative_input_change(x, adapted.phi, module.form),
        **{f"change_{k}": v for k, v in change_norms(adapted.phi, start).items()},
        "support_ctc_before": before,
        "support_ctc_after": after,
    }


def start_against_identity(module: IbciModule, sessions: list[Session]) -> np.ndarray:
    """Per validation sentence: the WER item at the meta-learned start phi_0 minus the one at
    the identity, both unadapted (its mean: the session-averaged WER difference; below 0: the
    learned start alone decodes the new sessions better than no alignment)."""
    rows = {}
    for name, phi in (("start", module.start_params()), ("identity", module.zero_shot_params())):
        phi = {k: v.detach() for k, v in phi.items()}
        scored = []
        for session in sessions:
            batch = pad_batch([(session, session.eval_indices())])
            texts = module.transcribe(batch, phi)
            scored.append((texts, [session.cues[i] for i in session.eval_indices()]))
        rows[name] = per_item_rates(scored)[1]
    return rows["start"] - rows["identity"]


def fit_job(job: Job, settings: dict[str, Any]) -> dict[str, Any]:
    """Train the backbone ``job.subject`` on ``job.seed`` (top level: worker processes import
    it by name); return what rebuilds it: the module's and the data's constructor arguments
    and the weights, and the training time. ``job.params`` may set ``meta_steps`` (the budget
    evidence)."""
    began = time.perf_counter()
    cli = fit(job.seed, {**settings, **job.params}, job.subject)
    # The data's seed is the run's (``seed=None`` reads it from the process's seed_everything):
    # kept explicit, so that a later job, in a process whose last seed was another, rebuilds
    # the sessions this backbone was trained on, not another seed's.
    data = constructor_args(cli.datamodule.hparams) | {"seed": cli.datamodule.seed}
    return {
        "model": constructor_args(cli.model.hparams),
        "data": data,
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
def load_models(**keys: str) -> dict[str, Any]:
    """One seed's stored backbones (eval mode, with the lexicon of their training
    transcripts, as after a fit) and their data; kept per process, as the jobs a worker runs
    often share a seed. ``models["data"]``: the data of the last one (every backbone of a seed
    reads the same sessions)."""
    models: dict[str, Any] = {}
    for name, key in keys.items():
        backbone = torch.load(backbone_path(key), weights_only=True)
        module = IbciModule(**backbone["model"])
        module.load_state_dict(backbone["state"])
        data = IbciDataModule(**backbone["data"])
        data.setup()
        module.lexicon = Lexicon(data.lexicon_words)  # what the fit's setup builds
        models[name], models["data"] = module.eval(), data
    return models


def tune_job(job: Job, settings: dict[str, Any]) -> float:
    """One tuning configuration: the session-averaged WER on the validation sessions (the last
    held-in ones, never trained on)."""
    models = load_models(**job.params["backbones"])
    scored = score_sessions(
        job.subject,
        models,
        models["data"].val_sessions,
        settings["n_calibration"],
        dict(job.params["params"]),
        settings,
    )
    return float(per_item_rates([(g, r) for g, _, r, _, _ in scored])[1].mean())


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
    # the precondition's metric, the method's alone (NaN for the others: never a passed check)
    extra: dict[str, Any] = {"val_start_minus_identity_wer": float("nan")}
    if subject == "meta_alignment":
        out["diagnostics"] = [d for *_, d, _ in scored]
        pooled = models["pooled_meta"]
        out["learned"] = {
            "seed": seed,
            "inner_step_sizes": {
                k: {
                    "mean": float(v.detach().exp().mean()),
                    "min": float(v.detach().exp().min()),
                    "max": float(v.detach().exp().max()),
                }
                for k, v in pooled.log_step.items()
            },
            "inner_step_size_start": pooled.hparams.inner_lr,
            "phi0_change_from_identity": change_norms(
                {k: v.detach() for k, v in pooled.phi0.items()}, pooled.zero_shot_params()
            ),
        }
        extra["val_start_minus_identity_wer"] = start_against_identity(pooled, data.val_sessions)
    result = {
        "test_wer": wer,
        "test_cer": cer,
        "test_wer_lexicon": wer_lexicon,
        "wer_slope_per_day": slope,
        "wer_last_minus_first_day": last_minus_first,
        **extra,
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


def experiment(spec, run: ClaimJobs, tuning=None) -> dict[str, Any]:
    """Backbones, tuning (unless ``tuning`` is given: the replication keeps the registered seeds'
    choice) and every subject on every seed of ``spec``; returns results, evidence and more."""
    # ---- the backbones, stored for the later jobs
    fits = {(b, seed): Job(b, seed, {}, "fit") for seed in spec.seeds for b in BACKBONES}
    fitted = run(list(fits.values()))
    backbones = {
        seed: {b: store_backbone(fitted[fits[b, seed]]) for b in BACKBONES} for seed in spec.seeds
    }
    train_times = {b: [fitted[fits[b, seed]]["train_s"] for seed in spec.seeds] for b in BACKBONES}

    # ---- tuning on the first seed's validation sessions
    if tuning is None:
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
    }
    return {
        "results": results,
        "tuning": tuning,
        "evidence": evidence,
        "backbones": backbones,
        "per_session": per_session,
        "sweep": sweep,
    }


def run_claim_experiment(argv: list[str] | None = None) -> dict[str, Any]:
    """Tune on validation, run every subject on every seed (and, with ``--replicate``, on the
    replication seeds with the registered tuning), judge, add the budget evidence and a
    diagnosis when the method fails a check, write results/."""
    parser = reproduce_parser(__doc__.splitlines()[0], project_file=__file__)
    args = parser.parse_args(argv)  # --jobs (default 2, the 2 cores; 1 with --quick), --fresh
    spec = load_claim_spec(CLAIM_FILE, subjects=SUBJECTS, metrics=METRICS, args=args)
    start = time.perf_counter()
    settings = dict(spec.settings)
    run = ClaimJobs(claim_job, args=args, settings=settings, cache_dir=JOBS_DIR,
                    revision=code_revision(PROJECT), label="ibci-fewshot")  # fmt: skip
    registered = experiment(spec, run)
    results, evidence = registered["results"], registered["evidence"]
    judgement = judge(spec, results)
    replication = None
    if args.replicate:
        rspec = spec.for_replication()
        replicated = experiment(rspec, run, tuning=registered["tuning"])
        replication = Replication(rspec, replicated["results"], judge(rspec, replicated["results"]))
        evidence["replication"] = {
            k: replicated["evidence"][k] for k in ("adapted_layer", "learned_meta_state")
        }
    judgements = [judgement] + ([replication.judgement] if replication else [])
    failed = [
        c.name
        for c in spec.checks
        if any(not j.outcomes[spec.method][c.name].passed for j in judgements)
    ]
    budget = method_budget(spec, run, registered) if failed else None
    grids = tuning_grids(spec.tuning, spec.subjects)
    evidence["tuning_edges"] = {
        **grid_edges(registered["tuning"], grids, "lr"),
        **grid_edges(registered["tuning"], grids, "lr_scale"),
    }
    evidence["paper_wer_not_comparable"] = PAPER_WER
    figures = plot(args.out, registered["per_session"], registered["sweep"], settings)
    pre_text = "precondition met" if judgement.precondition_met else "PRECONDITION NOT MET"
    means = {s: float(np.mean([np.mean(v) for v in results[s]["test_wer"]])) for s in SUBJECTS}
    headline = (
        f"{pre_text}; 3-sentence WER: meta {means['meta_alignment']:.3f}, session layers "
        f"{means['session_layers']:.3f}, plain-gradient {means['gradient_alignment']:.3f}, "
        f"zero-shot {means['zero_shot']:.3f}, many-sentence fine-tune "
        f"{means['many_sentence_finetune']:.3f} "
        "(simulation; the paper's 7.41% is real FALCON H2, not comparable)"
    )
    notes = " ".join(
        [
            "All data are SIMULATED (simulate.py) and written as FALCON-H2-format NWB files, read "
            "back by the real loader; the paper's 7.41% WER (real FALCON H2, unknown language "
            "model) is not comparable.",
            "Greedy CTC decoding is checked; test_wer_lexicon (nearest training-vocabulary word) "
            "is reported beside it as a cheap language-model stand-in.",
        ]
    )
    write_claim(
        args.out,
        project="ibci-fewshot",
        spec=spec,
        results=results,
        judgement=judgement,
        replication=replication,
        config={"settings": settings, "quick": args.quick},
        wall_time_s=time.perf_counter() - start,
        tuning=registered["tuning"],
        evidence=evidence,
        headline=headline,
        notes=notes,
        figures=figures,
        jobs=summarise_jobs(run.ran),
        budget=budget,
        diagnosis=functools.partial(diagnose, spec=spec),
    )
    return {"verdict": judgement.verdict, "results": results}


def method_budget(spec, run: ClaimJobs, registered: dict[str, Any]) -> dict[str, Any]:
    """The budget evidence (papers_eval.mechanism.budget_evidence): the method at 1x and 2x its
    registered meta-steps on the first seed (the pooled backbone refit with the longer stage 2;
    stage 1 is the same), against plain-gradient alignment on the same backbone. Wall time: the
    backbone's training time; updates: the meta-steps."""
    seed, multipliers = spec.seeds[0], (1.0, 2.0)
    tuned = registered["tuning"].best
    meta_steps = int(spec.settings["meta_steps"])

    def steps(multiplier: float) -> dict[str, int]:
        return {} if multiplier == 1.0 else {"meta_steps": int(meta_steps * multiplier)}

    fits = {m: Job("pooled_meta", seed, steps(m), "fit") for m in multipliers}
    fitted = run(list(fits.values()))
    keys = {m: store_backbone(fitted[fits[m]]) for m in multipliers}

    def job(subject: str, multiplier: float) -> Job:
        backbones = {**registered["backbones"][seed], "pooled_meta": keys[multiplier]}
        return Job(
            subject, seed, {"params": tuned.get(subject, {}), "backbones": backbones}, "test"
        )

    rival = "gradient_alignment"
    done = run([job(s, m) for s in (spec.method, rival) for m in multipliers])

    def point(subject: str, multiplier: float, seed: int) -> dict[str, float]:
        return {
            "metric": float(np.mean(done[job(subject, multiplier)]["result"]["test_wer"])),
            "wall_time_s": float(fitted[fits[multiplier]]["train_s"]),
            "updates": float(meta_steps * multiplier),
        }

    evidence = budget_evidence(
        point, method=spec.method, rival=rival, goal="lower", seed=seed, multipliers=multipliers
    )
    return {"check": "beats_gradient_alignment", "metric": "test_wer", **evidence}


def diagnose(record: dict[str, Any], *, spec) -> list:
    """Findings for a verdict that is not ``held``, each citing the record's numbers:

    - a precondition failed (``not shown``), on the registered or the replication seeds: when
      every seed's value is on the good side of the bar and only the interval over 3 seed means
      crosses it, ``check`` (the rule, not the miniature, decides); else the meta-learned start
      worse than the identity on validation is ``implementation`` (meta-training did not
      transfer) and any other precondition ``check`` (the miniature does not pose the problem);
    - a control misbehaved (``not shown``): ``check``, citing the control's advantage;
    - a tuned knob on an end of its grid (``evidence.tuning_edges``): ``check``;
    - where the registered seeds' controls behaved and their preconditions held, the method
      failed a check: with the budget evidence's gap growing by more than the checks' 0.02 margin
      at 2x meta-steps, ``implementation`` (undertrained); else, when meta-learning beats
      plain-gradient alignment on the method's own backbone, ``implementation`` (the sessions
      set aside for meta-learning cost the backbone more than meta-learning buys), citing the
      budget evidence as converged; else ``idea`` (``undetermined`` while the method's own knob
      sits on a grid edge);
    - anything else: ``undetermined``, citing the method's checks.
    """
    if record["verdict"] in ("held", "held, not replicated"):
        return []
    method, findings = spec.method, []
    replication = record.get("replication") or {}

    def cite(subject: str, check: str) -> tuple[str, str]:
        o = record["outcomes"][subject][check]
        return (
            f"outcomes.{subject}.{check}.advantage.estimate",
            f"{subject} on {check}: {'pass' if o['passed'] else 'fail'}",
        )

    registered = {
        p["name"]: (f"preconditions.{i}", p) for i, p in enumerate(record["preconditions"])
    }
    replicated = {
        name: (f"replication.preconditions.{name}", p)
        for name, p in (replication.get("preconditions") or {}).items()
    }
    for where, outcomes, metrics, seeds_text in (
        ("", registered, record["metrics"], ""),
        ("replication.", replicated, replication.get("metrics") or {}, " on the replication seeds"),
    ):
        for name, (path, pre) in outcomes.items():
            if pre["passed"]:
                continue
            check = next(c for c in spec.preconditions if c.name == name)
            per_seed = metrics[check.subject][check.metric]["per_seed"]
            sign = 1.0 if check.goal == "higher" else -1.0
            every_seed = all(sign * (v - check.threshold) > 0 for v in per_seed)
            start = name == "start_no_worse_than_identity"
            if every_seed:
                cause, why = (
                    "check",
                    "every seed's value is on the good side of the bar; the interval over "
                    f"{len(per_seed)} seed means (t with {len(per_seed) - 1} degrees of freedom) "
                    "crosses it: the rule, not the miniature, decides",
                )
            elif start:
                cause, why = (
                    "implementation",
                    "the meta-learned start decodes the validation sessions worse than no "
                    "alignment; meta-training did not learn a transferable start",
                )
            else:
                cause, why = "check", "the miniature does not pose the problem the claim is about"
            findings.append(
                finding(
                    cause,
                    f"precondition {name} failed{seeds_text}: {why}",
                    (f"{path}.advantage.estimate", f"{name}'s advantage"),
                    *[
                        (f"{where}metrics.{check.subject}.{check.metric}.per_seed.{k}", f"seed {k}")
                        for k in range(len(per_seed))
                    ],
                )
            )
    findings += control_findings(record, {c.name: c.checks for c in spec.controls})
    edges = (record.get("evidence") or {}).get("tuning_edges") or {}
    for subject, edge in edges.items():
        if edge["at_edge"]:
            findings.append(
                finding(
                    "check",
                    f"{subject}'s tuned {edge['param']} ({edge['chosen']:g}) sits at an end of "
                    f"its grid [{edge['low']:g}, {edge['high']:g}]: the grid must be extended "
                    "before the comparison is fair",
                    (f"evidence.tuning_edges.{subject}.chosen", f"{subject}'s chosen value"),
                )
            )
    failed = [c for c, o in record["outcomes"][method].items() if not o["passed"]]
    fair = all(c["behaved"] for c in record["controls"]) and all(
        p["passed"] for p in record["preconditions"]
    )
    budget = record.get("budget") or {}
    metrics = record["metrics"]
    same = metrics.get("gradient_alignment_same_backbone", {}).get("test_wer", {}).get("mean")
    if failed and fair:
        method_cites = [cite(method, c) for c in failed]
        budget_cites = (
            [
                (
                    "budget.gap.1",
                    "the gap to plain-gradient alignment at the registered meta-steps",
                ),
                ("budget.gap.2", "the gap at 2x meta-steps"),
            ]
            if budget
            else []
        )
        if budget and budget["gap_change"] > 0.02:
            findings.append(
                finding(
                    "implementation",
                    f"the method fails {', '.join(failed)}; at 2x meta-steps its advantage over "
                    "plain-gradient alignment grows by more than the checks' margin: the "
                    "registered budget undertrains it",
                    *method_cites,
                    *budget_cites,
                )
            )
        elif same is not None and metrics[method]["test_wer"]["mean"] < same:
            findings.append(
                finding(
                    "implementation",
                    f"the method fails {', '.join(failed)}. On its own backbone the meta-learned "
                    "alignment decodes better than plain-gradient alignment, but that backbone's "
                    "stage 1 did not see the sessions set aside for meta-learning (the "
                    "reconstruction's cross-day episodes), and the baselines' backbone, which saw "
                    "them, gains more than meta-learning does"
                    + (
                        "; twice the meta-steps move the gap by less than the checks' margin "
                        "(converged)"
                        if budget
                        else ""
                    ),
                    *method_cites,
                    (f"metrics.{method}.test_wer.mean", "the method's WER"),
                    (
                        "metrics.gradient_alignment_same_backbone.test_wer.mean",
                        "plain-gradient alignment on the method's backbone",
                    ),
                    (
                        "metrics.gradient_alignment.test_wer.mean",
                        "plain-gradient alignment on the backbone that saw every training session",
                    ),
                    (
                        "metrics.zero_shot.test_wer.mean",
                        "the unadapted backbone that saw every training session",
                    ),
                    *budget_cites,
                )
            )
        else:
            own_edge = edges.get(method, {}).get("at_edge")
            findings.append(
                finding(
                    "undetermined" if own_edge else "idea",
                    f"the method fails {', '.join(failed)} with the controls behaving, the "
                    "preconditions met and no gain from twice the meta-steps, and does not beat "
                    "plain-gradient alignment even on its own backbone",
                    *method_cites,
                    *budget_cites,
                )
            )
    if not findings:
        findings.append(
            finding(
                "undetermined",
                "no rule of this diagnosis applies; the method's checks are cited",
                *[cite(method, c) for c in record["outcomes"][method]],
            )
        )
    return findings


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
