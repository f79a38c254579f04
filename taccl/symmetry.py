"""Symmetry orbits: one representative per orbit of chunks, links and (chunk, link) pairs.

The routing MILP builds one variable per orbit of (chunk, link) pairs under the sketch's symmetry group
instead of one per pair tied together by equality constraints; constraints are written for one chunk per
chunk orbit only, because the image of a constraint under a symmetry is the same constraint once every
variable is replaced by its orbit's.
"""
from __future__ import annotations

from .problem import Problem, inverse


class Orbits:
    def __init__(self, prob: Problem):
        self.prob = prob
        coll, group = prob.collective, prob.group
        C = coll.num_chunks
        self.rep = [-1] * C
        self.from_rep = [None] * C  # group element g with g(rep[c]) = c
        self.reps = []
        for c in range(C):
            if self.rep[c] >= 0:
                continue
            self.reps.append(c)
            for g in group:
                img = coll.permute_chunk(c, g)
                if self.rep[img] < 0:
                    self.rep[img] = c
                    self.from_rep[img] = g
        inverses = {id(g): inverse(g) for g in group}  # shared: a tuple per chunk took a GB on 512 ranks
        self.to_rep = [inverses[id(g)] for g in self.from_rep]
        self.stab = {c: [g for g in group if coll.permute_chunk(c, g) == c] for c in self.reps}
        self.trivial_stab = all(len(s) == 1 for s in self.stab.values())

    def image_link(self, perm, li: int) -> int:
        l = self.prob.links[li]
        return self.prob.link_index[(perm[l.src], perm[l.dst])]

    def canon_link(self, c: int, li: int):
        """(representative chunk, link in its frame) naming the orbit of (c, link li)."""
        r = self.rep[c]
        lr = self.image_link(self.to_rep[c], li)
        if len(self.stab[r]) > 1:
            lr = min(self.image_link(s, lr) for s in self.stab[r])
        return r, lr

    def canon_rank(self, c: int, rank: int):
        r = self.rep[c]
        x = self.to_rep[c][rank]
        if len(self.stab[r]) > 1:
            x = min(s[x] for s in self.stab[r])
        return r, x

    def link_orbit_reps(self) -> list:
        """One link per orbit of links under the group, the least index (union-find over the generators'
        images)."""
        sets = DisjointSets()
        for g in self.prob.generators:
            for li in range(len(self.prob.links)):
                sets.union(li, self.image_link(g, li))
        return sorted(min(s) for s in sets.groups(range(len(self.prob.links))))

    def resource_orbit_reps(self, loads) -> set | None:
        """The least (by repr) resource of each orbit under the group, `loads` giving each link's (resource,
        busy time) pairs in a fixed order; None when a generator does not map resources to resources (a
        link's image shares its resources with other links than their images do)."""
        sets = DisjointSets()
        for g in self.prob.generators:
            image = {}
            for li, pairs in enumerate(loads):
                other = loads[self.image_link(g, li)]
                if len(other) != len(pairs):
                    return None
                for (res, busy), (res_g, busy_g) in zip(pairs, other):
                    if image.setdefault(res, res_g) != res_g or abs(busy - busy_g) > 1e-9 * max(1.0, busy):
                        return None
                    sets.union(res, res_g)
        return {min(s, key=repr) for s in sets.groups(res for pairs in loads for res, _ in pairs)}


class DisjointSets:
    """Union-find over hashable items (path halving)."""

    def __init__(self):
        self.parent = {}

    def find(self, a):
        parent = self.parent
        while parent.setdefault(a, a) != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    def union(self, a, b):
        a, b = self.find(a), self.find(b)
        if a != b:
            self.parent[a] = b

    def groups(self, items) -> list:
        """The sets of `items`, each a list."""
        out = {}
        for a in items:
            out.setdefault(self.find(a), []).append(a)
        return list(out.values())
