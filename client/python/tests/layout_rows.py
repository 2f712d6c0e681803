"""Which (sample, position) each router row of a rank holds: layout.md
sections 2 (padding), 4 (CP zigzag) and 5 (SP rows), written from the text,
independently of rollpackd's code, for the Python tests that check rows."""

from typing import Callable, List, Sequence, Tuple


def router_positions(sample_ids: Sequence[str], length_of: Callable[[str], int], cp_size: int,
                     cp_rank: int, tp_size: int, tp_rank: int,
                     sequence_parallel: bool = True) -> List[Tuple[str, int]]:
    """[(sample id, position q in its padded sequence)] of every router row of
    the rank (cp_rank of a CP group of cp_size, tp_rank of tp_size) for a
    micro-batch packing ``sample_ids`` in this order. Positions q >= the
    sample's length are padding."""
    c, s = cp_size, (tp_size if sequence_parallel else 1)
    a = 2 * c * s if c > 1 else s
    positions = []
    for sid in sample_ids:
        n = length_of(sid)
        padded = -(-n // a) * a
        h = padded // (2 * c)
        pieces = [(0, padded)] if c == 1 else [(cp_rank * h, (cp_rank + 1) * h),
                                                ((2 * c - 1 - cp_rank) * h, (2 * c - cp_rank) * h)]
        positions += [(sid, q) for lo, hi in pieces for q in range(lo, hi)]
    if not sequence_parallel or tp_size == 1:
        return positions
    rows = len(positions) // tp_size
    return positions[tp_rank * rows:(tp_rank + 1) * rows]
