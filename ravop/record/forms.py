"""A part of a program recorded in more than one form, the session choosing one at activation. A fit's replicas
run resident (one loop each, which needs a worker per replica at once) or as segments (any number of workers):
the same values either way, and which suits depends on the live workers, which recording does not ask (a
recording is a function of the script). So both forms are recorded, one after the other, into the graph's table,
each from the same values before it and with its own persisted names; the form recorded last is the one later ops
read, and the one in-process evaluation and a compile given no choice take. At activation the session says which
form runs (ravop.client.graph_kinds), and the compiler keeps it, pointing what read the last form's results at
the chosen one's and dropping the others (compiler/ir.py)."""
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Sequence

RESIDENT, SEGMENTS = "resident", "segments"


@dataclass
class Form:
    """One form's ops (ids `start` to `stop`), its `results` (the ids later ops may read from it, in the order
    every form of the part gives them) and the names it persisted as plain ops (`persisted`) or from loop steps
    (`step_outputs`, a `ravop.record.step_outputs.StepOutputs`, the graph's before it included)."""
    start: int
    stop: int
    results: List[int]
    persisted: Dict[str, Any]
    step_outputs: Any


@dataclass
class Forms:
    """The forms of one part: `forms` by name in the order recorded (the last one's results are what later ops
    read); `workers`: the live workers the first form needs at once (resident replicas: one per replica)."""
    what: str                 # what is recorded so, for messages: "DiLoCo(...)'s replicas"
    workers: int
    forms: Dict[str, Form] = field(default_factory=dict)

    @property
    def last(self) -> str:
        return list(self.forms)[-1]

    def choose(self, live_workers: int) -> str:
        """The form that runs on a cluster of `live_workers`: the first where they can hold it, else the last."""
        first = list(self.forms)[0]
        return first if live_workers >= self.workers else self.last


def record_forms(graph: Any, what: str, workers: int, names: Sequence[str],
                 record: Callable[[str], List[Any]]) -> List[Any]:
    """Record `record(name)` once per form of `names` (one name: that form only, no choice), each returning its
    results (Ops); returns the last one's. Each form starts from the persisted names the graph had before the
    part; the graph keeps the last one's."""
    if len(names) == 1:
        return record(names[0])
    part = Forms(what, workers)
    before = graph.persisted, graph.step_outputs, graph._scalars
    results: List[Any] = []
    for name in names:
        with _form(graph, *before) as made:
            start = len(graph.nodes)
            results = record(name)
        part.forms[name] = Form(start, len(graph.nodes), [op.id for op in results], made["persisted"],
                                made["step_outputs"])
    graph.strategy_notes.forms.append(part)
    return results


@contextmanager
def _form(graph: Any, persisted: Dict[str, Any], step_outputs: Any, scalars: Dict[Any, Any]
          ) -> Iterator[Dict[str, Any]]:
    """The graph recording one form: its persisted names start as `persisted` and `step_outputs` were, and the
    constants it shares for Python numbers as `scalars` (a form reads no op of another's); what the form added is
    handed back in the dict yielded."""
    graph.persisted, graph.step_outputs, graph._scalars = dict(persisted), step_outputs.copy(), dict(scalars)
    made: Dict[str, Any] = {}
    yield made
    made["persisted"] = {name: op.id for name, op in graph.persisted.items() if persisted.get(name) is not op}
    made["step_outputs"] = graph.step_outputs
