"""DynamiCrafter as a frozen workbench backbone (``type: dynamicrafter``), implemented here.

The U-Net, the resampler and the schedule / sampler are this package's own code; the text and
image towers are transformers' CLIP classes and the VAE is diffusers' ``AutoencoderKL``, all loaded
from the official checkpoints' own keys (``from_checkpoint``). ``dynamicrafter_latent_residual``
is the reference adapter. ``workbench-dynamicrafter convert`` turns a pickled ``model.ckpt`` into
safetensors once.

Nothing is imported here: the registry loads the classes through the entry points.
"""
