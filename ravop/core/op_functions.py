"""Namespace of the generated op functions (`R.add`, `R.sum`, ...), filled by `ravop.record.api.build` when
`import ravop as R` loads its API (`ravop.client.requester`).

VJP rules record their backward ops through it (ops code imports it as `R`, and `F` is torch.nn.functional);
`import ravop as R` re-exports the same functions. It imports nothing, so that the ops modules can import it
without a cycle; a pickled function names `ravop` as its module (`ravop.record.api.make_function`), which loads the API.
"""
