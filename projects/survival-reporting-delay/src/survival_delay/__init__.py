"""Survival analysis with reporting delays and administrative censoring."""
