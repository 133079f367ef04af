"""`python -m laggard` runs the CLI (tests use this so they exercise the checkout they run in)."""

import sys

from laggard.cli import main

sys.exit(main())
