"""Adaptive Internal Computation: value-of-computation halting for policies."""
