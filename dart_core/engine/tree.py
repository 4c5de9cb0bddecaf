"""DraftTree: the flat-array draft tree every part of the engine reads.

A tree of N nodes is four arrays of length N. Node 0 is the root: the token the
target chose at the previous step, committed to the output but not yet run through
the target. Every other node is a drafted guess; ``parents[i] < i`` (topological
order), so masks and paths are built in one pass.

    tokens  [N] int64   token id of each node
    parents [N] int64   index of the parent node; -1 for the root
    depths  [N] int64   0 for the root, depth(parent) + 1 otherwise
    scores  [N] float64 drafter's score of the node (higher = more confident);
                        the root's score is 0 by convention

Verification feeds all N nodes to the target in one forward: node i sees the
committed prefix, its ancestors and itself (``attention_mask``), at position
``committed_length + depths[i]`` (``position_ids``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


class InvalidTreeError(ValueError):
    """A DraftTree's arrays do not describe a valid rooted tree."""


@dataclass(frozen=True)
class DraftTree:
    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    scores: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        tokens = np.asarray(self.tokens, dtype=np.int64).reshape(-1)
        parents = np.asarray(self.parents, dtype=np.int64).reshape(-1)
        depths = np.asarray(self.depths, dtype=np.int64).reshape(-1)
        n = tokens.shape[0]
        scores = (np.zeros(n, dtype=np.float64) if self.scores is None
                  else np.asarray(self.scores, dtype=np.float64).reshape(-1))
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "depths", depths)
        object.__setattr__(self, "scores", scores)
        self._validate()

    # ------------------------------------------------------------------ construction
    @classmethod
    def root_only(cls, root_token: int) -> "DraftTree":
        """The empty draft: only the root (plain autoregressive step)."""
        return cls(tokens=[root_token], parents=[-1], depths=[0], scores=[0.0])

    @classmethod
    def trusted(cls, tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray, scores: np.ndarray) -> "DraftTree":
        """A tree from arrays already int64 / float64 that a producer guarantees valid (the native DART pruner
        builds its trees that way, tested against the validating constructor): no copy, no validation, so the
        drafting hot path does not pay a dozen numpy checks a step."""
        tree = object.__new__(cls)
        for name, value in (("tokens", tokens), ("parents", parents), ("depths", depths), ("scores", scores)):
            object.__setattr__(tree, name, value)
        return tree

    @classmethod
    def from_parents(cls, tokens: Sequence[int], parents: Sequence[int],
                     scores: Sequence[float] | None = None) -> "DraftTree":
        """Build a tree from tokens and parents; depths are derived."""
        parents_arr = np.asarray(parents, dtype=np.int64)
        depths = np.zeros(len(parents_arr), dtype=np.int64)
        for i in range(1, len(parents_arr)):
            p = parents_arr[i]
            if not 0 <= p < i:
                raise InvalidTreeError(
                    f"node {i} has parent {p}; parents must precede their children (0 <= parent < index)")
            depths[i] = depths[p] + 1
        return cls(tokens=tokens, parents=parents_arr, depths=depths, scores=scores)

    @classmethod
    def from_paths(cls, root_token: int, paths: Sequence[Sequence[int]],
                   path_scores: Sequence[float] | None = None) -> "DraftTree":
        """Merge token sequences that all continue ``root_token`` into a prefix tree.

        Node scores are the best score among the paths through the node, so a node
        shared by several paths ranks by its strongest continuation.
        """
        tokens, parents, scores = [root_token], [-1], [0.0]
        children: dict[tuple[int, int], int] = {}
        for k, path in enumerate(paths):
            s = 0.0 if path_scores is None else float(path_scores[k])
            node = 0
            for tok in path:
                key = (node, int(tok))
                if key not in children:
                    children[key] = len(tokens)
                    tokens.append(int(tok))
                    parents.append(node)
                    scores.append(s)
                node = children[key]
                scores[node] = max(scores[node], s)
        return cls.from_parents(tokens, parents, scores)

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        n = self.tokens.shape[0]
        if n == 0:
            raise InvalidTreeError("a DraftTree needs at least the root node")
        for name in ("parents", "depths", "scores"):
            if getattr(self, name).shape[0] != n:
                raise InvalidTreeError(
                    f"{name} has {getattr(self, name).shape[0]} entries but tokens has {n}; all arrays must match")
        if self.parents[0] != -1 or self.depths[0] != 0:
            raise InvalidTreeError("node 0 must be the root: parents[0] == -1 and depths[0] == 0")
        if (self.tokens < 0).any():
            raise InvalidTreeError(f"token ids must be >= 0, got {int(self.tokens.min())}")
        if n > 1:
            idx = np.arange(1, n)
            par = self.parents[1:]
            if ((par < 0) | (par >= idx)).any():
                bad = int(idx[(par < 0) | (par >= idx)][0])
                raise InvalidTreeError(
                    f"node {bad} has parent {int(self.parents[bad])}; parents must precede children")
            if (self.depths[1:] != self.depths[par] + 1).any():
                bad = int(idx[self.depths[1:] != self.depths[par] + 1][0])
                raise InvalidTreeError(f"node {bad} has depth {int(self.depths[bad])}, "
                                       f"expected depth(parent) + 1 = {int(self.depths[self.parents[bad]]) + 1}")
        if np.isnan(self.scores).any():
            raise InvalidTreeError("scores must not be NaN")

    # ------------------------------------------------------------------ views
    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_drafted(self) -> int:
        """Nodes other than the root."""
        return len(self) - 1

    @property
    def max_depth(self) -> int:
        return int(self.depths.max())

    def ancestor_mask(self) -> np.ndarray:
        """[N, N] bool: mask[i, j] is True when j is i itself or one of its ancestors."""
        n = len(self)
        mask = np.zeros((n, n), dtype=bool)
        mask[0, 0] = True
        for i in range(1, n):
            mask[i] = mask[self.parents[i]]
            mask[i, i] = True
        return mask

    def position_offsets(self) -> np.ndarray:
        """[N] int64: position of each node relative to the root (= its depth)."""
        return self.depths.copy()

    def children(self) -> list[list[int]]:
        """children[i]: indices of node i's children, highest score first (ties: lower index first)."""
        kids: list[list[int]] = [[] for _ in range(len(self))]
        for i in range(1, len(self)):
            kids[int(self.parents[i])].append(i)
        for lst in kids:
            lst.sort(key=lambda j: (-self.scores[j], j))
        return kids

    def likeliest(self, k: int) -> list[int]:
        """The root and the k-1 nodes an acceptance walk most likely visits, best first: grown from the root,
        each time taking the highest-scored child of a node already taken (ties: lower index), so a node comes
        after its ancestors. Drafters score a node by its whole path, so this follows the likeliest paths."""
        taken = [0]
        kids = self.children()
        candidates: list[int] = list(kids[0])
        while len(taken) < min(k, len(self)) and candidates:
            best = min(candidates, key=lambda j: (-self.scores[j], j))
            candidates.remove(best)
            taken.append(best)
            candidates.extend(kids[best])
        return taken

    def leaves(self) -> list[int]:
        has_child = np.zeros(len(self), dtype=bool)
        has_child[self.parents[1:]] = True
        return [i for i in range(len(self)) if not has_child[i]]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to ``node`` inclusive."""
        path = []
        while node != -1:
            path.append(int(node))
            node = int(self.parents[node])
        return path[::-1]

    def root_to_leaf_paths(self) -> list[list[int]]:
        return [self.path_to(leaf) for leaf in self.leaves()]

    def truncated(self, max_depth: int | None = None, max_nodes: int | None = None) -> "DraftTree":
        """The subtree of nodes with depth <= max_depth, cut to the first max_nodes nodes.

        Node order is kept, so parents still precede children; the root always stays.
        Returns ``self`` when nothing is cut.
        """
        return self.truncated_with_index(max_depth, max_nodes)[0]

    def truncated_with_index(self, max_depth: int | None = None,
                             max_nodes: int | None = None) -> tuple["DraftTree", np.ndarray | None]:
        """``truncated`` plus the old -> new node index map (-1 = cut), or None when nothing is cut."""
        if (max_nodes is None or len(self) <= max(max_nodes, 1)) and (
                max_depth is None or int(self.depths.max()) <= max(max_depth, 0)):
            return self, None   # the common case, every step: nothing to cut
        keep = np.ones(len(self), dtype=bool)
        if max_depth is not None:
            keep &= self.depths <= max(max_depth, 0)
        if max_nodes is not None:
            keep &= np.cumsum(keep) <= max(max_nodes, 1)
        if keep.all():
            return self, None
        old = np.flatnonzero(keep)
        new_index = -np.ones(len(self), dtype=np.int64)
        new_index[old] = np.arange(len(old))
        parents = np.where(self.parents[old] >= 0, new_index[np.maximum(self.parents[old], 0)], -1)
        return DraftTree(self.tokens[old], parents, self.depths[old], self.scores[old]), new_index

    def to_dict(self) -> dict:
        return {"tokens": self.tokens.tolist(), "parents": self.parents.tolist(),
                "depths": self.depths.tolist(), "scores": [float(s) for s in self.scores]}

    @classmethod
    def from_dict(cls, d: dict) -> "DraftTree":
        return cls(tokens=d["tokens"], parents=d["parents"], depths=d["depths"], scores=d.get("scores"))

