"""Learning What Evaluators Value: A Reliable Approach to Modeling Evaluator Preferences."""
