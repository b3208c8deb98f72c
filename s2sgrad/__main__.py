"""`python -m s2sgrad` runs the command line."""

import sys

from s2sgrad.cli import main

sys.exit(main())
