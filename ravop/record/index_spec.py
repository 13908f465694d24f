"""The canonical form of a numpy-style index, and a small safe parser for the original API's index strings.

An op's params must be JSON-able, so `x[1:3, None, ..., [0, 2], t]` is stored as a tuple of items:
  an int               an int index
  ("s", start, stop, step)   a slice (None for an omitted part)
  ("n",)               None: a new axis of size 1
  ("e",)               Ellipsis
  ("l", values)        a (nested) list of ints or bools, kept inline
  ("t",)               a tensor index: the op's next tensor input (Ops, numpy arrays and torch tensors)

The original system ran `eval` on strings like "[:,-1,:]". Here they are tokenised and parsed by a
grammar that only knows integers, colons, commas, brackets, `...`, `None`, `True` and `False`; anything
else is a `ValueError` naming the offending text.
"""
import re

import numpy as np
import torch

from .graph import Op

MAX_STRING = 4096   # longer index strings are refused rather than parsed
MAX_DEPTH = 32      # nesting depth of lists inside an index string

_TOKEN = re.compile(r"\s*(?:(-?\d+)|(\.\.\.)|(None|True|False)|([\[\]:,]))")


# The original's wrapped form, str({"indices": "[:,-1,:]"}): the index string inside a one-key dict's text.
_WRAPPED = re.compile(r"""\s*\{\s*(['"])indices\1\s*:\s*(['"])(?P<index>[^'"]*)\2\s*\}\s*\Z""")


def canonical_index(index):
    """(spec, tensors): the canonical items of a user's index and the tensor indices it holds, in order."""
    if isinstance(index, str):
        wrapped = _WRAPPED.match(index)
        index = parse_index(wrapped.group("index") if wrapped else index)
    items = index if isinstance(index, tuple) else (index,)
    spec, tensors = [], []
    for item in items:
        spec.append(_item(item, tensors))
    if sum(1 for s in spec if s == ("e",)) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    return tuple(spec), tuple(tensors)


def _int(value, what):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int or None, not {value!r}")
    return int(value)


def _item(item, tensors):
    if type(item) is int:  # the common cases first: recording x[i] is a hot path
        return item
    if type(item) is slice:
        start, stop, step = item.start, item.stop, item.step
        if (start is None or type(start) is int) and (stop is None or type(stop) is int) and \
                (step is None or type(step) is int and step != 0):
            return ("s", start, stop, step)
    if isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)):
        return int(item)
    if isinstance(item, slice):
        parts = tuple(None if v is None else _int(v, "a slice bound") for v in (item.start, item.stop, item.step))
        if parts[2] == 0:
            raise ValueError("slice step cannot be zero")
        return ("s",) + parts
    if item is None:
        return ("n",)
    if item is Ellipsis:
        return ("e",)
    if isinstance(item, (Op, np.ndarray, torch.Tensor)):
        tensors.append(item)
        return ("t",)
    if isinstance(item, list):
        try:
            array = np.asarray(item)
        except ValueError:  # ragged nesting
            array = np.asarray([None])
        if array.dtype.kind not in "bi" and not (array.size == 0 and array.dtype.kind == "f"):
            raise TypeError(f"a list index must hold ints or bools (a rectangular nesting), not {item!r}")
        values = array.astype(bool if array.dtype.kind == "b" else np.int64).tolist()
        return ("l", _tuples(values))
    raise TypeError(f"cannot index with {item!r} of type {type(item).__name__}: use ints, slices, None, "
                    "..., lists of ints or bools, or int/bool tensors")


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


# ------------------------------------------------------------------------------------------------ parser

def parse_index(text):
    """The index a string like "[:, -1, 1:3]" or "[[0, 2], ..., None]" denotes (never `eval`)."""
    if len(text) > MAX_STRING:
        raise ValueError(f"index string is longer than {MAX_STRING} characters")
    tokens = _tokenize(text)
    parser = _Parser(text, tokens)
    parser.expect("[")
    items = parser.items("]")
    parser.expect("]")
    if parser.pos != len(tokens):
        parser.fail("text after the closing ']'")
    return items[0] if len(items) == 1 and not parser.trailing_comma else tuple(items)


def _tokenize(text):
    tokens, pos = [], 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            if not text[pos:].strip():
                break
            raise ValueError(f"index string {text!r}: unexpected {text[pos:pos + 20]!r} at position {pos}; "
                             "only integers, ':', ',', '[', ']', '...', None, True and False are allowed")
        number, ellipsis, word, punct = match.groups()
        tokens.append(("int", int(number)) if number is not None else (ellipsis or word or punct, None))
        pos = match.end()
    return tokens


class _Parser:
    def __init__(self, text, tokens):
        self.text, self.tokens, self.pos, self.trailing_comma = text, tokens, 0, False

    def peek(self):
        return self.tokens[self.pos][0] if self.pos < len(self.tokens) else "end"

    def take(self):
        kind, value = self.tokens[self.pos]
        self.pos += 1
        return kind, value

    def fail(self, what):
        raise ValueError(f"index string {self.text!r}: {what} (token {self.pos + 1})")

    def expect(self, kind):
        if self.peek() != kind:
            self.fail(f"expected {kind!r}, found {self.peek()!r}")
        self.take()

    def items(self, close):
        """Comma-separated subscript items up to `close`."""
        items = []
        while True:
            if self.peek() == close:
                if not items:
                    self.fail("empty index")
                return items
            items.append(self.item())
            self.trailing_comma = False
            if self.peek() != ",":
                return items
            self.take()
            self.trailing_comma = True

    def item(self):
        kind = self.peek()
        if kind == "...":
            self.take()
            return Ellipsis
        if kind == "None":
            self.take()
            return None
        if kind == "[":
            return self.list(0)
        start = self.take()[1] if kind == "int" else None
        if self.peek() != ":":
            if start is None:
                self.fail(f"unexpected {kind!r}")
            return start
        self.take()
        stop = self.take()[1] if self.peek() == "int" else None
        step = None
        if self.peek() == ":":
            self.take()
            step = self.take()[1] if self.peek() == "int" else None
        return slice(start, stop, step)

    def list(self, depth):
        if depth >= MAX_DEPTH:
            self.fail(f"lists nested deeper than {MAX_DEPTH}")
        self.expect("[")
        values = []
        while self.peek() != "]":
            kind = self.peek()
            if kind == "[":
                values.append(self.list(depth + 1))
            elif kind == "int":
                values.append(self.take()[1])
            elif kind in ("True", "False"):
                values.append(self.take()[0] == "True")
            else:
                self.fail(f"unexpected {kind!r} in a list index")
            if self.peek() != ",":
                break
            self.take()
        self.expect("]")
        return values
