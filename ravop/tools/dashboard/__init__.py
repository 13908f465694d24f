"""The web dashboard: `ravop dashboard`, or `R.initialize(dashboard=True)`. A small HTTP server (stdlib) with
JSON endpoints over `ravop.tools.status` and `ravop.client.training_losses`, and a static page (hand-written JS and SVG,
shipped in the package: no CDN) that polls them: live workers, graphs with progress and ETA, the selected
graph's subgraphs as a DAG coloured by state, and its loss curve while it trains."""
from .server import Dashboard

__all__ = ["Dashboard"]
