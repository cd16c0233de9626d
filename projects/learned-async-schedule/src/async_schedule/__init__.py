"""Learning When to Denoise: learned convex asynchronous schedules (LAS) for joint
texture + semantic latent diffusion."""
