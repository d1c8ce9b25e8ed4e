"""``python -m workbench ...`` (what ``torchrun -m workbench train CONFIG`` runs on every rank)."""

import sys

from workbench.cli import main

sys.exit(main())
