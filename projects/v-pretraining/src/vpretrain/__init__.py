"""V-pretraining: a self-supervised learner and a task designer trained by downstream value."""
