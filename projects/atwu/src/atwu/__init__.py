"""Alternating Token-Weighted Unlearning."""
