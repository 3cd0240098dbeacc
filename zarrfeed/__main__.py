"""`python -m zarrfeed ...`: the same as the `zarrfeed` command."""
import sys

from .cli import main

if __name__ == "__main__":  # importing this module (documentation tools inspect every module) runs nothing
    sys.exit(main())
