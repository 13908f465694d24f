"""A cluster on this machine: the embedded server and workers (`R.initialize()` with no URL), the workers'
fork server as the requester sees it, and a local Redis Cluster."""
