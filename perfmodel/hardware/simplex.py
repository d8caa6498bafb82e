"""Piecewise-linear interpolation over a Delaunay triangulation, located in numpy.

A calibration's GEMM table (:mod:`perfmodel.hardware.calibration`) is interpolated over the
Delaunay triangulation of its measured points in ``(log2 m, log2 n, log2 k)``. The triangulation
is Qhull's (``scipy.spatial.Delaunay``: its simplices, their neighbours and barycentric
transforms), computed once per point set and saved in :data:`TRIANGULATION_DIR` under the
SHA-256 of the points (:func:`save_triangulation`): a shipped table is located and interpolated
here in numpy, without loading scipy. A point set without a saved triangulation (a user's own
calibration folder) is triangulated by scipy when it is first used.

Point location repeats ``Delaunay.find_simplex(x, bruteforce=True)`` step by step (the same
tolerances, the same scan order, the same arithmetic), so a point gets the simplex and
barycentric weights scipy gives it. The nearest measured point (outside the hull) is found as
``cKDTree.query`` finds it, over the same saved tree (its point order and splits) and in the same
visiting order: of equally near points (a query midway between two measured shapes) the same
one wins.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hardware_specs import ROOT as SPECS_ROOT
from perfmodel.core.files import atomic_write, parse_json, read_text_bounded

__all__ = ["TRIANGULATION_DIR", "NearestTree", "Triangulation", "interpolation_of",
           "points_digest", "save_triangulation"]

TRIANGULATION_DIR = SPECS_ROOT / "triangulations"
"""Saved Delaunay triangulations of the shipped point sets (``<digest>.json``)."""

#: scipy's tolerances of ``find_simplex``: 100 ulp inside a simplex, sqrt of that towards a
#: degenerate (flat) neighbour.
_EPS = 100 * np.finfo(np.float64).eps
_EPS_BROAD = float(np.sqrt(_EPS))

#: Query points located at once (the barycentric coordinates of a chunk against every simplex).
_CHUNK = 128


def points_digest(points: np.ndarray) -> str:
    """SHA-256 of a point set (its float64 values and shape): the name of its saved
    triangulation."""
    p = np.ascontiguousarray(points, dtype=np.float64)
    return hashlib.sha256(f"{p.shape};".encode() + p.tobytes()).hexdigest()


@dataclass(frozen=True, eq=False)
class Triangulation:
    """A Delaunay triangulation in 3-D: ``simplices`` (S, 4) vertex indices, ``neighbors``
    (S, 4) (-1: none; ``neighbors[s, j]`` faces vertex ``j``), ``transform`` (S, 4, 3): rows
    0-2 the inverse of ``T`` with ``T[:, j] = p_j - p_3``, row 3 ``p_3`` (all NaN for a flat
    simplex), as ``scipy.spatial.Delaunay`` holds them."""

    points: np.ndarray
    simplices: np.ndarray
    neighbors: np.ndarray
    transform: np.ndarray

    def find_simplex(self, x: np.ndarray) -> np.ndarray:
        """Index of the simplex holding each row of ``x`` (-1: outside the hull), as
        ``Delaunay.find_simplex(x, bruteforce=True)``: the first simplex in order whose
        barycentric coordinates all lie in ``[-eps, 1 + eps]``; where a flat simplex comes
        first, the first of its neighbours that holds the point with ``sqrt(eps)`` leeway
        towards it."""
        x = np.asarray(x, dtype=np.float64)
        out = np.full(len(x), -1, dtype=np.int64)
        lo = self.points.min(axis=0) - _EPS
        hi = self.points.max(axis=0) + _EPS
        near = ~((x < lo) | (x > hi)).any(axis=1)
        idx = np.flatnonzero(near)
        for start in range(0, len(idx), _CHUNK):
            part = idx[start:start + _CHUNK]
            out[part] = self._locate(x[part])
        return out

    def _locate(self, x: np.ndarray) -> np.ndarray:
        """:meth:`find_simplex` of points inside the bounding box."""
        n_s = len(self.simplices)
        c = barycentric(self.transform, x)  # (u, S, 4)
        inside = ((c >= -_EPS) & (c <= 1.0 + _EPS)).all(axis=2)
        first = np.where(inside.any(axis=1), inside.argmax(axis=1), n_s)
        hit = np.where(first < n_s, first, -1)
        flat, nb, low = self._flat_passes
        if len(flat) == 0:
            return hit
        # a flat simplex passes a point on to the first neighbour (in order) that holds it
        # with sqrt(eps) leeway towards the flat one; the earliest flat simplex that does wins
        cn = c[:, nb, :]  # (u, P, 4)
        ok = ((cn >= low[None]) & (cn <= 1.0 + _EPS)).all(axis=2)
        any_ok = ok.any(axis=1)
        j = ok.argmax(axis=1)
        take = any_ok & (flat[j] < first)
        return np.where(take, nb[j], hit)

    @functools.cached_property
    def _flat_passes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every (flat simplex, neighbour) pair a point can be passed through, in scipy's scan
        order: the flat simplex, the neighbour and its coordinates' lower bounds (P, 4)."""
        flat_s = np.isnan(self.transform[:, 0, 0])
        pairs = [(f, int(self.neighbors[f, k])) for f in np.flatnonzero(flat_s) for k in range(4)
                 if self.neighbors[f, k] != -1 and not flat_s[self.neighbors[f, k]]]
        f = np.array([p[0] for p in pairs], dtype=np.int64)
        nb = np.array([p[1] for p in pairs], dtype=np.int64)
        low = np.where(self.neighbors[nb] == f[:, None], -_EPS_BROAD, -_EPS)
        return f, nb, low.reshape(-1, 4)


def barycentric(transform: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Barycentric coordinates (u, S, 4) of points ``x`` (u, 3) in every simplex of
    ``transform`` (S, 4, 3), summed in scipy's order: ``c_i = T_i0 d_0 + T_i1 d_1 + T_i2
    d_2`` with ``d = x - p_3``, ``c_3 = 1 - c_0 - c_1 - c_2``."""
    d = [x[:, None, j] - transform[None, :, 3, j] for j in range(3)]
    c = np.empty((x.shape[0], transform.shape[0], 4))
    for i in range(3):
        c[:, :, i] = (transform[None, :, i, 0] * d[0] + transform[None, :, i, 1] * d[1]
                      + transform[None, :, i, 2] * d[2])
    c[:, :, 3] = 1.0 - c[:, :, 0] - c[:, :, 1] - c[:, :, 2]
    return c


@dataclass(frozen=True, eq=False)
class NearestTree:
    """scipy's k-d tree of a point set (``cKDTree(points)``): ``indices`` the point order of
    the leaves, ``nodes`` (K, 6) per node ``split_dim`` (-1: a leaf), ``split``, the ``less``
    and ``greater`` child (node indices), ``start`` and ``end`` (its slice of ``indices``);
    node 0 is the root."""

    points: np.ndarray
    indices: np.ndarray
    nodes: np.ndarray

    def query(self, x: np.ndarray) -> np.ndarray:
        """Index of the nearest point (Euclidean) to each row of ``x``, as
        ``cKDTree.query(x)[1]``."""
        x = np.asarray(x, dtype=np.float64)
        pts = self.points.tolist()
        lo, hi = self.points.min(axis=0).tolist(), self.points.max(axis=0).tolist()
        nodes = [(int(r[0]), float(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]))
                 for r in self.nodes]
        order = self.indices.tolist()
        return np.array([_nearest(q, pts, lo, hi, nodes, order) for q in x.tolist()],
                        dtype=np.int64)


def _nearest(x: list[float], pts: list, lo: list[float], hi: list[float], nodes: list,
             order: list[int]) -> int:
    """One query of :meth:`NearestTree.query`: scipy's ``query_single_point`` for k = 1, eps
    = 0, p = 2 (squared distances; nodes visited nearest first from a binary heap)."""
    side = [0.0] * len(x)
    dist = 0.0
    for i, xi in enumerate(x):
        s = 0.0
        if xi - hi[i] > s:
            s = xi - hi[i]
        elif lo[i] - xi > s:
            s = lo[i] - xi
        dist += s * s - side[i]
        side[i] = s * s
    best, upper = -1, float("inf")
    heap: list = []
    cur = [0, side, dist]  # node, squared side distances, their sum
    while True:
        split_dim, split, less, greater, start, end = nodes[cur[0]]
        if split_dim == -1:
            for i in range(start, end):
                p = pts[order[i]]
                d = 0.0
                for j, xj in enumerate(x):
                    d += (p[j] - xj) * (p[j] - xj)
                if d < upper:
                    best, upper = order[i], d
            if not heap:
                return best
            cur = _heap_pop(heap)
            continue
        if cur[2] > upper:
            return best
        far = [0, list(cur[1]), cur[2]]
        if x[split_dim] < split:
            cur[0], far[0], s = less, greater, split - x[split_dim]
        else:
            cur[0], far[0], s = greater, less, x[split_dim] - split
        far[2] += s * s - far[1][split_dim]
        far[1][split_dim] = s * s
        if cur[2] > far[2]:
            cur, far = far, cur
        if far[2] <= upper:
            _heap_push(heap, far)


def _heap_push(heap: list, item: list) -> None:
    """scipy's ``heap::push`` (a binary min-heap on ``item[2]``; ties stay where they are)."""
    heap.append(item)
    i = len(heap) - 1
    while i > 0 and heap[i][2] < heap[(i - 1) // 2][2]:
        heap[i], heap[(i - 1) // 2] = heap[(i - 1) // 2], heap[i]
        i = (i - 1) // 2


def _heap_pop(heap: list) -> list:
    """scipy's ``heap::pop``: the root, the last item moved up and sifted down."""
    top = heap[0]
    heap[0] = heap[-1]
    heap.pop()
    n, i = len(heap), 0
    while True:
        j, k = 2 * i + 1, 2 * i + 2
        if not ((j < n and heap[i][2] > heap[j][2]) or (k < n and heap[i][2] > heap[k][2])):
            return top
        child = k if (k < n and heap[j][2] > heap[k][2]) else j
        heap[child], heap[i] = heap[i], heap[child]
        i = child


def _from_doc(points: np.ndarray, doc: dict) -> tuple[Triangulation | None, NearestTree]:
    tree = NearestTree(points=points, indices=np.array(doc["kdtree"]["indices"], dtype=np.int64),
                       nodes=np.array(doc["kdtree"]["nodes"], dtype=np.float64).reshape(-1, 6))
    if doc.get("simplices") is None:
        return None, tree
    nan_row = [float("nan")] * 12
    t = np.array([nan_row if r is None else r for r in doc["transform"]], dtype=np.float64)
    return Triangulation(points=points,
                         simplices=np.array(doc["simplices"], dtype=np.int64).reshape(-1, 4),
                         neighbors=np.array(doc["neighbors"], dtype=np.int64).reshape(-1, 4),
                         transform=t.reshape(-1, 4, 3)), tree


def _spans_3d(points: np.ndarray) -> bool:
    """Whether the points can be triangulated: at least 4, not all in one plane."""
    return len(points) >= 4 and np.linalg.matrix_rank(points[1:] - points[0]) == 3


def _scipy_doc(points: np.ndarray) -> dict:
    """The saved form of scipy's Delaunay triangulation (Qhull; None where the points do not
    span 3-D) and k-d tree of ``points``. scipy is loaded here only: a shipped table never
    needs it."""
    from scipy.spatial import Delaunay, cKDTree

    kd = cKDTree(points)
    nodes: list[list[float]] = []

    def walk(node) -> int:
        i = len(nodes)
        nodes.append([node.split_dim, float(node.split), -1, -1, node.start_idx, node.end_idx])
        if node.split_dim != -1:
            nodes[i][2] = walk(node.lesser)
            nodes[i][3] = walk(node.greater)
        return i

    walk(kd.tree)
    doc: dict = {"points_sha256": points_digest(points), "simplices": None,
                 "kdtree": {"indices": kd.indices.tolist(), "nodes": nodes}}
    if _spans_3d(points):
        tri = Delaunay(points)
        t = tri.transform.reshape(len(tri.simplices), 12)
        doc |= {"simplices": tri.simplices.tolist(), "neighbors": tri.neighbors.tolist(),
                "transform": [None if np.isnan(r[0]) else [float(v) for v in r] for r in t]}
    return doc


@functools.lru_cache(maxsize=32)
def _cached(digest: str, raw: bytes, n: int) -> tuple[Triangulation | None, NearestTree]:
    points = np.frombuffer(raw, dtype=np.float64).reshape(n, 3).copy()
    points.setflags(write=False)
    f = TRIANGULATION_DIR / f"{digest}.json"
    doc = parse_json(read_text_bounded(f, "JSON"), str(f)) if f.exists() else {}
    if doc.get("points_sha256") != digest:
        doc = _scipy_doc(points)
    return _from_doc(points, doc)


def interpolation_of(points: np.ndarray) -> tuple[Triangulation | None, NearestTree]:
    """The Delaunay triangulation of ``points`` (N, 3; None where they do not span 3-D) and
    their k-d tree: the saved ones (:data:`TRIANGULATION_DIR`) where there are, else scipy's,
    computed now."""
    p = np.ascontiguousarray(points, dtype=np.float64)
    return _cached(points_digest(p), p.tobytes(), len(p))


def save_triangulation(points: np.ndarray, folder: str | Path = TRIANGULATION_DIR) -> Path:
    """Triangulate ``points`` (Qhull), build their k-d tree and save both as ``<digest>.json``
    in ``folder`` (flat simplices' transforms as null). Returns its path."""
    p = np.ascontiguousarray(points, dtype=np.float64)
    doc = _scipy_doc(p)
    path = Path(folder) / f"{doc['points_sha256']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(doc, separators=(",", ":")) + "\n")
    return path
