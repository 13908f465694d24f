"""A data provider's side of federated graphs: its data files, the partial statistics it releases and its
privacy ledger."""
