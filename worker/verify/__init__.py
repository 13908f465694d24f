"""Verification: redundant execution (`verify=k`), adaptive spot checks of subgraphs and loop segments, and
the narrowing of a dispute to one step and op."""
