"""`python -m ravop`: the `ravop` command line (ravop.tools.cluster_cli)."""
from .tools.cluster_cli import main

raise SystemExit(main())
