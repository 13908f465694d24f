"""What models and histories look like in a Jupyter notebook: HTML tables (`_repr_html_`) beside the text a
terminal gets. IPython is not a dependency: it is looked up only to know whether one runs."""
import html
import sys
from typing import Any, Optional, Sequence


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (not a terminal IPython, which shows text)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def html_table(header: Sequence[Any], rows: Sequence[Sequence[Any]], caption: Optional[str] = None) -> str:
    """A plain HTML table, every cell escaped."""
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    title = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{title}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class Summary:
    """A model's layers: name, type, output shape, parameters; text as str(), an HTML table in a notebook."""

    HEADER = ("Layer", "Type", "Output shape", "Params")

    def __init__(self, rows: list[tuple[Any, ...]], total: int) -> None:
        self.rows, self.total = rows, total

    def __str__(self) -> str:
        widths = [max(len(str(r[i])) for r in self.rows + [self.HEADER]) for i in range(4)]
        line = "-" * (sum(widths) + 6)
        text = [line, "  ".join(h.ljust(w) for h, w in zip(self.HEADER, widths)), line]
        text += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in self.rows]
        text += [line, f"Total params: {self.total:,}", line]
        return "\n".join(text)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return html_table(self.HEADER, self.rows) + f"<p>Total params: {self.total:,}</p>"
