"""The backbone contract as a conformance kit: every promise checked in one call.

A plugin author runs it against their backbone in their own tests (plain functions: no pytest
needed to import it)::

    from workbench.testing import check_backbone

    def test_my_backbone_keeps_the_contract():
        check_backbone(lambda: MyBackbone(tiny_config), raw={"video": clips, "action": actions},
                       adapter_factory=lambda: MyAdapter(channels=16), steps=4)

It raises one :class:`~workbench.errors.ConformanceError` whose message lists every promise
with what was found (see :data:`PROMISES` for the list), and returns the
:class:`ConformanceReport` when all hold. Adapters that work inside the base (``lora``,
``action_modulation``, ``controlnet``) have their own check, :func:`check_inside_adapter`.
"""

from workbench.errors import ConformanceError
from workbench.testing.inside import INSIDE_PROMISES, check_inside_adapter
from workbench.testing.kit import ConformanceReport, Finding, ProbeAdapter, counting_base_calls
from workbench.testing.promises import PROMISES, check_backbone

__all__ = ["INSIDE_PROMISES", "PROMISES", "ConformanceError", "ConformanceReport", "Finding", "ProbeAdapter",
           "check_backbone", "check_inside_adapter", "counting_base_calls"]
