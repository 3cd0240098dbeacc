"""`python -m zarrfeed ...`: the same as the `zarrfeed` command."""
import sys

from .cli import main

sys.exit(main())
