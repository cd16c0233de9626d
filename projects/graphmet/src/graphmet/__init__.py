"""GraphMet: a Koopman processor for graph weather models."""
