"""Federated analytics (approach='federated'): statistics of data that stays on the providers. The rules
(`rules`), the exact merge of partial statistics (`stats`), the requester's session steps (`session`) and the
`R.federated_*` functions (`api`)."""
