"""Federated analytics (approach='federated'): statistics of data that stays on the providers. The column rules
(`column_rules`), the exact merge of providers' partials (`partials`), the federated kind of graph the session
asks (`graph_kind`) and what it releases (`release`); the parameterised queries providers read (`queries`),
quantile sketches (`sketches`), histograms (`histograms`), differential privacy (`privacy`) and secure
aggregation (`secure`), with dropout recovery (`recovery`, over Shamir shares: `shamir`). The statistics
themselves are registry ops (`ravop.ops.federated_stats`); docs/users/federated.md says what each mode reveals
to whom."""
