"""counterfactual-instruments."""
