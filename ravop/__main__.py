"""`python -m ravop`: the `ravop` command line (ravop.cluster_cli)."""
from .cluster_cli import main

raise SystemExit(main())
