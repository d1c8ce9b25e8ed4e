"""Wan2.2 TI2V-5B as a frozen workbench backbone (``type: wan22_ti2v``).

The backbone drives diffusers' own ``WanImageToVideoPipeline`` / ``WanPipeline`` and injects
the adapter by wrapping the transformer's forward; ``wan22_latent_residual`` is the reference
adapter for its 48-channel latents. ``python -m workbench_wan22.tiny OUT_DIR`` writes a tiny
random pipeline in the diffusers layout for tests and examples.

Nothing is imported here: the registry loads the classes through the entry points.
"""
