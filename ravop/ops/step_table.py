"""`step_row`: one row of a table, picked by a loop's step count. In a loop step (`ravop.record.loop`) its `row` is a
step counter, so a step reads a value that changes from step to step (Gossip's pairing after step s, a learning
rate schedule's value) from one table uploaded once: the plan does not grow with the number of steps."""
from ..core.registry import REQUIRED, register


def _row_shape(table, row):
    if not table.shape:
        raise ValueError("step_row reads rows of a table of at least 1 dimension, not a scalar")
    if type(row) is not int or row < 0:
        raise ValueError(f"row must be an int >= 0, not {row!r}")
    return table.shape[1:], table.dtype


@register("step_row", inputs=("table",), params={"row": REQUIRED}, shape=_row_shape, method=False, counter="row")
def step_row(table, row):
    """table[row]; in a loop step, `row` is the recorded row plus the training steps run before the step."""
    if not 0 <= row < table.shape[0]:
        raise IndexError(f"step_row: row {row} is past the table's {table.shape[0]} rows (the loop ran more steps "
                         "than its table covers)")
    return table[row].clone()
