"""Previews: the pictures of latents every view shows, and the decoders that make them.

The linear preview (:mod:`~workbench.inspect.previews.linear_preview`), the distilled tiny decoder
(:mod:`~workbench.inspect.previews.tiny_preview`), fitting and caching them
(:mod:`~workbench.inspect.previews.preview`, :mod:`~workbench.inspect.previews.preview_cache`), the one
decoding path (:mod:`~workbench.inspect.previews.decoding`), the backbone's latent geometry
(:mod:`~workbench.inspect.previews.latent_space`), finished pictures
(:mod:`~workbench.inspect.previews.pictures`) and colour maps (:mod:`~workbench.inspect.previews.colors`).
The names users need are exported by :mod:`workbench.inspect`.
"""
