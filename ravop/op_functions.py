"""Namespace of the generated op functions (`F.add`, `F.sum`, ...), filled by `ravop.api.build`.

VJP rules record their backward ops through it; `import ravop as R` re-exports the same functions.
"""
