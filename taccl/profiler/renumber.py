"""GPU renumbering: a relabelling of the GPUs that keeps the NVLink graph (an automorphism, or an isomorphism
onto a reference topology's graph) and puts the NIC next to GPU 0.

On Azure NDv2 the hypervisor hands out GPUs in a different order from VM to VM, and the NIC sits behind the
PCIe switch of some pair of them. TACCL's sketches assume one fixed numbering with the NIC near GPU 0; the
profiler finds a numbering that satisfies both and prints it as a `CUDA_VISIBLE_DEVICES` value.

`order[k]` is the physical GPU (the probe's CUDA index) that becomes GPU `k`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice

import networkx as nx
from networkx.algorithms.isomorphism import GraphMatcher

MAX_MAPPINGS = 50000


@dataclass
class Renumbering:
    order: list
    reason: str
    candidates: int = 0
    reference: str | None = None
    nic_next_to_gpu0: bool | None = None
    notes: list = field(default_factory=list)

    def inverse(self) -> list:
        inv = [0] * len(self.order)
        for new, phys in enumerate(self.order):
            inv[phys] = new
        return inv


def labelled_graph(n: int, edges: dict) -> nx.Graph:
    """edges: {(a, b): label} with a != b; direction is ignored (the label of either direction is kept)."""
    g = nx.Graph()
    g.add_nodes_from(range(n))
    for (a, b), lab in edges.items():
        g.add_edge(a, b, label=lab)
    return g


def _uniform(g: nx.Graph) -> bool:
    n = g.number_of_nodes()
    labels = {d["label"] for _, _, d in g.edges(data=True)}
    return g.number_of_edges() == 0 or (g.number_of_edges() == n * (n - 1) // 2 and len(labels) == 1)


def find_renumbering(n: int, edges: dict, *, near_nic=(), pcie_groups=None, reference_edges: dict | None = None,
                     reference_groups=None, reference_name: str | None = None) -> Renumbering | None:
    """The best relabelling; None when the measured graph does not match the reference.

    Preference, in order: GPU 0 is next to the NIC (in `near_nic`); the reference's PCIe groups land on
    measured groups; as few GPUs move as possible; then the lexicographically smallest order.
    """
    near_nic = set(near_nic)
    g = labelled_graph(n, edges)
    ref = labelled_graph(n, reference_edges) if reference_edges is not None else g
    if reference_edges is not None and not nx.is_isomorphic(ref, g, edge_match=lambda a, b: a["label"] == b["label"]):
        return None
    groups = [frozenset(x) for x in (pcie_groups or [])]
    ref_groups = [frozenset(x) for x in (reference_groups or [])]

    if _uniform(g) and _uniform(ref):
        # Every permutation keeps the graph: NIC's GPUs first, then group by group, each group in order.
        first = sorted(near_nic)
        rest = [x for grp in sorted(groups, key=min) for x in sorted(grp) if x not in near_nic]
        rest += [x for x in range(n) if x not in first and x not in rest]
        order = first + rest if near_nic else list(range(n))
        return Renumbering(order, "all permutations keep the GPU graph (switch or no direct links)", 0,
                           reference_name, (order[0] in near_nic) if near_nic else None)

    gm = GraphMatcher(ref, g, edge_match=lambda a, b: a["label"] == b["label"])
    best, count = None, 0
    for mapping in islice(gm.isomorphisms_iter(), MAX_MAPPINGS):
        count += 1
        order = [mapping[k] for k in range(n)]
        nic_ok = order[0] in near_nic if near_nic else True
        grp_hits = sum(1 for rg in ref_groups if frozenset(order[k] for k in rg) in groups)
        moved = sum(1 for k in range(n) if order[k] != k)
        key = (not nic_ok, -grp_hits, moved, order)
        if best is None or key < best[0]:
            best = (key, order, nic_ok)
    notes = []
    if count == MAX_MAPPINGS:
        notes.append(f"search stopped after {MAX_MAPPINGS} mappings")
    _, order, nic_ok = best
    what = "isomorphism onto the reference" if reference_edges is not None else "automorphism of the measured graph"
    reason = f"{what}, chosen from {count} that keep the link types"
    if near_nic:
        reason += "; GPU 0 is next to the NIC" if nic_ok else "; no such mapping puts the NIC next to GPU 0"
    return Renumbering(order, reason, count, reference_name, nic_ok if near_nic else None, notes)


def cuda_visible_devices(order, env_value: str | None = None) -> str:
    """The CUDA_VISIBLE_DEVICES value for `order`, composed with the value the probe ran under (if any)."""
    base = [v.strip() for v in env_value.split(",")] if env_value and env_value.strip() else None
    if base is not None and len(base) < len(order):
        base = None
    return ",".join(base[p] if base else str(p) for p in order)
