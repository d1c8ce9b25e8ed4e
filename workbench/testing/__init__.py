"""The backbone contract as a conformance kit: every promise checked in one call.

A plugin author runs it against their backbone in their own tests (plain functions: no pytest
needed to import it); the example below runs it on the embedded backbone. It checks the promises of
the required part and those of each optional capability the backbone declares
(:mod:`workbench.core.capabilities`; :data:`CAPABILITY_PROMISES`), says which capabilities it found,
raises one :class:`~workbench.errors.ConformanceError` whose message lists every promise with what was
found (see :data:`PROMISES` for the list), and returns the :class:`ConformanceReport` when all hold.
Adapters that work inside the base (``lora``, ``action_modulation``, ``controlnet``) have their own
check, :func:`check_inside_adapter`.

Examples:
    >>> from workbench.adapters.latent_residual import LatentResidual
    >>> from workbench.backbones.tiny_video import TinyVideo
    >>> from workbench.testing import check_backbone
    >>> def test_my_backbone_keeps_the_contract():          # raw: the backbone's example_batch()
    ...     check_backbone(lambda: TinyVideo(image_size=16, frames=4, width=16, ae_width=8, depth=1),
    ...                    adapter_factory=lambda: LatentResidual(width=16, depth=1), steps=4)
    >>> test_my_backbone_keeps_the_contract()         # raises ConformanceError naming each broken promise
"""

from workbench.errors import ConformanceError
from workbench.testing.inside import INSIDE_PROMISES, check_inside_adapter
from workbench.testing.kit import ConformanceReport, Finding, ProbeAdapter, counting_base_calls
from workbench.testing.promises import CAPABILITY_PROMISES, PROMISES, check_backbone

__all__ = ["CAPABILITY_PROMISES", "INSIDE_PROMISES", "PROMISES", "ConformanceError", "ConformanceReport",
           "Finding", "ProbeAdapter", "check_backbone", "check_inside_adapter", "counting_base_calls"]
