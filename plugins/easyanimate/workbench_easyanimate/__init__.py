"""EasyAnimate V5.1 as a frozen workbench backbone (``type: easyanimate``).

The backbone drives diffusers' own ``EasyAnimatePipeline`` and injects the adapter by wrapping
the transformer's forward, splitting guidance's doubled batch so each half is composed with its
own conditions; ``easyanimate_latent_residual`` is the reference adapter.
``python -m workbench_easyanimate.tiny OUT_DIR`` writes a tiny random pipeline in the diffusers
layout for tests and examples.

Nothing is imported here: the registry loads the classes through the entry points.
"""
