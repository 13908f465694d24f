"""`python -m ravop`: the `ravop` command line (ravop.cli)."""
import sys

from .cli import main

sys.exit(main())
