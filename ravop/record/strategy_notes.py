"""What recording notes of a graph's strategies for activation and the session, apart from the op table and the
job settings (`Graph.strategy_notes`): the fits recorded under a strategy, each one's loops by role and its rounds,
and the parts recorded in more than one form (record/forms.py)."""
from dataclasses import dataclass, field
from typing import Any, Dict, List


@dataclass
class StrategyNotes:
    # strategies fits were recorded with: the compiler leaves their segments and averagings unfolded
    fits: List[Any] = field(default_factory=list)
    # per such fit: role ('replica r') -> its loop op ids (ravop.client.placement)
    loops: List[Dict[str, List[int]]] = field(default_factory=list)
    # strategy repr -> role -> its rounds' schedule (ravop.client.placement)
    rounds: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    # parts recorded in more than one form, one chosen at activation (record/forms.py's `Forms`)
    forms: List[Any] = field(default_factory=list)
