"""Evaluation plumbing every ``reproduce`` shares.

- ``write_results`` / ``load_results``: the results record (``results/claim.json``) and its
  markdown table (``results/claim.md``); the root README's table is built from these files.
- ``markdown_table``: method-vs-baseline table.
- ``bootstrap_ci``: percentile-bootstrap confidence intervals (scipy.stats.bootstrap).
- ``pareto_front``: the non-dominated points of an accuracy-vs-cost trade-off.
- ``line_plot`` / ``pareto_plot``: PNG figures with matplotlib (Agg backend, no display needed).
"""

from papers_eval.plots import line_plot, pareto_plot
from papers_eval.record import (
    RESULTS_FIELDS,
    git_revision,
    hardware_info,
    load_results,
    write_results,
)
from papers_eval.stats import bootstrap_ci, pareto_front
from papers_eval.table import format_value, markdown_table

__all__ = [
    "RESULTS_FIELDS",
    "bootstrap_ci",
    "format_value",
    "git_revision",
    "hardware_info",
    "line_plot",
    "load_results",
    "markdown_table",
    "pareto_front",
    "pareto_plot",
    "write_results",
]
