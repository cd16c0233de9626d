"""RLA-WM: visual-feature world models via Residual Latent Action."""
