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
        self.to_rep = [inverse(g) for g in self.from_rep]
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
        """One link per orbit of links under the group (union-find over the generators' images)."""
        parent = list(range(len(self.prob.links)))

        def find(a):
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a

        for g in self.prob.generators:
            for li in range(len(self.prob.links)):
                a, b = find(li), find(self.image_link(g, li))
                if a != b:
                    parent[max(a, b)] = min(a, b)
        return sorted({find(li) for li in range(len(self.prob.links))})
