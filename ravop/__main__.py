"""`python -m ravop`: the `ravop` command line (ravop.cli)."""
from .cli import main

raise SystemExit(main())
