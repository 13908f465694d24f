"""Federated analytics (approach='federated'): statistics of data that stays on the providers. The column rules
(`column_rules`), the exact merge of providers' partials (`partials`) and the federated kind of graph the session
asks (`graph_kind`); the statistics themselves are registry ops (`ravop.ops.federated_stats`)."""
