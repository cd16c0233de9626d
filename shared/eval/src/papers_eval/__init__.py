"""Evaluation plumbing every ``reproduce`` shares.

The claim protocol (``claim``, ``tuning``, ``claim_record``):
- ``load_claim_spec``: ``configs/claim.yaml`` (checks, method, baselines, negative and positive
  controls, seeds, tuning grid), validated before anything trains.
- ``tune``: the same validation-split grid for every method and control, recorded.
- ``run_seeds`` / ``judge``: per-seed results, then every check applied to the method and to each
  control, with intervals over seeds and test items; the verdict is ``held``, ``did not hold`` or
  ``not shown`` (a control misbehaved). Nobody types a verdict.
- ``write_claim`` / ``load_claim``: ``results/claim.json`` (schema 3; schema 2 still loads,
  marked protocol v2) and ``claim.md``; ``Replication`` (``reproduce --replicate``: the same
  checks on disjoint seeds), ``combined_verdict`` (held / held, not replicated / did not hold /
  mixed / not shown).
- ``diagnosis`` (``finding``, ``attach_diagnosis``): why a verdict is not held, citing the
  record's numbers. ``papers_eval.mechanism`` (imported on its own: it loads Lightning):
  gradient shares of named loss terms, "did it move / change its input", budget evidence.
- ``papers_eval.jobs``: the shared job runner of every claim run.

Also: ``contrast_interval`` and ``bootstrap_ci`` (intervals), ``markdown_table``, ``pareto_front``,
``line_plot`` / ``pareto_plot`` (PNG figures), and the schema-1 ``write_results`` /
``load_results`` that the first six projects still write until they move to the protocol.
"""

import importlib
from typing import TYPE_CHECKING, Any

# Names load on first use (PEP 562): a worker process of the job runner, or a tool that needs
# one function, does not pay for scipy and matplotlib at import. Nothing here imports torch.
_EXPORTS = {
    # papers_eval.claim
    "Check": "claim",
    "CheckOutcome": "claim",
    "ClaimSpec": "claim",
    "ClaimSpecError": "claim",
    "Control": "claim",
    "ControlOutcome": "claim",
    "Judgement": "claim",
    "MIN_SEEDS": "claim",
    "PROTOCOL": "claim",
    "SEED_SET_VERDICTS": "claim",
    "VERDICTS": "claim",
    "combined_verdict": "claim",
    "judge": "claim",
    "load_claim_spec": "claim",
    "run_seeds": "claim",
    "summarise": "claim",
    # papers_eval.claim_record
    "CLAIM_FIELDS": "claim_record",
    "RecordSchemaError": "claim_record",
    "Replication": "claim_record",
    "SCHEMA_VERSION": "claim_record",
    "V3_FIELDS": "claim_record",
    "attach_diagnosis": "claim_record",
    "load_claim": "claim_record",
    "rediagnose": "claim_record",
    "reproducible_part": "claim_record",
    "render_markdown": "claim_record",
    "write_claim": "claim_record",
    # papers_eval.diagnosis
    "CAUSES": "diagnosis",
    "Cite": "diagnosis",
    "DiagnosisError": "diagnosis",
    "Finding": "diagnosis",
    "finding": "diagnosis",
    # papers_eval.plots
    "line_plot": "plots",
    "pareto_plot": "plots",
    # papers_eval.record
    "RESULTS_FIELDS": "record",
    "code_revision": "record",
    "git_revision": "record",
    "hardware_info": "record",
    "load_results": "record",
    "provenance": "record",
    "write_results": "record",
    # papers_eval.stats
    "Interval": "stats",
    "bootstrap_ci": "stats",
    "contrast_interval": "stats",
    "pareto_front": "stats",
    # papers_eval.table
    "format_value": "table",
    "markdown_table": "table",
    # papers_eval.tuning
    "TuningResult": "tuning",
    "grid_edges": "tuning",
    "tune": "tuning",
    "tuning_grids": "tuning",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'papers_eval' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"papers_eval.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:  # static analysers and IDEs see the eager imports
    from papers_eval.claim import (
        MIN_SEEDS,
        PROTOCOL,
        SEED_SET_VERDICTS,
        VERDICTS,
        Check,
        CheckOutcome,
        ClaimSpec,
        ClaimSpecError,
        Control,
        ControlOutcome,
        Judgement,
        combined_verdict,
        judge,
        load_claim_spec,
        run_seeds,
        summarise,
    )
    from papers_eval.claim_record import (
        CLAIM_FIELDS,
        SCHEMA_VERSION,
        V3_FIELDS,
        RecordSchemaError,
        Replication,
        attach_diagnosis,
        load_claim,
        rediagnose,
        render_markdown,
        reproducible_part,
        write_claim,
    )
    from papers_eval.diagnosis import CAUSES, Cite, DiagnosisError, Finding, finding
    from papers_eval.plots import line_plot, pareto_plot
    from papers_eval.record import (
        RESULTS_FIELDS,
        code_revision,
        git_revision,
        hardware_info,
        load_results,
        provenance,
        write_results,
    )
    from papers_eval.stats import Interval, bootstrap_ci, contrast_interval, pareto_front
    from papers_eval.table import format_value, markdown_table
    from papers_eval.tuning import TuningResult, grid_edges, tune, tuning_grids

__all__ = [
    "CAUSES",
    "CLAIM_FIELDS",
    "PROTOCOL",
    "SEED_SET_VERDICTS",
    "V3_FIELDS",
    "Cite",
    "DiagnosisError",
    "Finding",
    "Replication",
    "attach_diagnosis",
    "combined_verdict",
    "rediagnose",
    "finding",
    "MIN_SEEDS",
    "RESULTS_FIELDS",
    "SCHEMA_VERSION",
    "VERDICTS",
    "Check",
    "CheckOutcome",
    "ClaimSpec",
    "ClaimSpecError",
    "Control",
    "ControlOutcome",
    "Interval",
    "Judgement",
    "RecordSchemaError",
    "TuningResult",
    "bootstrap_ci",
    "contrast_interval",
    "code_revision",
    "format_value",
    "git_revision",
    "grid_edges",
    "hardware_info",
    "judge",
    "line_plot",
    "load_claim",
    "load_claim_spec",
    "load_results",
    "provenance",
    "markdown_table",
    "pareto_front",
    "pareto_plot",
    "render_markdown",
    "reproducible_part",
    "run_seeds",
    "summarise",
    "tune",
    "tuning_grids",
    "write_claim",
    "write_results",
]
