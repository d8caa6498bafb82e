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
barycentric weights scipy gives it; the nearest measured point (outside the hull) is a brute
force scan over the points (``cKDTree.query``, lowest index among equally near points).
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

__all__ = ["TRIANGULATION_DIR", "Triangulation", "nearest_point", "points_digest",
           "save_triangulation", "triangulation_of"]

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


def nearest_point(points: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Index of the nearest row of ``points`` (Euclidean) to each row of ``x``; the lowest
    index among equally near ones."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty(len(x), dtype=np.int64)
    for start in range(0, len(x), _CHUNK):
        q = x[start:start + _CHUNK]
        d = [q[:, None, j] - points[None, :, j] for j in range(points.shape[1])]
        d2 = d[0] * d[0]
        for dj in d[1:]:
            d2 = d2 + dj * dj
        out[start:start + _CHUNK] = d2.argmin(axis=1)
    return out


def _from_doc(points: np.ndarray, doc: dict) -> Triangulation:
    nan_row = [float("nan")] * 12
    t = np.array([nan_row if r is None else r for r in doc["transform"]], dtype=np.float64)
    return Triangulation(points=points,
                         simplices=np.array(doc["simplices"], dtype=np.int64).reshape(-1, 4),
                         neighbors=np.array(doc["neighbors"], dtype=np.int64).reshape(-1, 4),
                         transform=t.reshape(-1, 4, 3))


def _qhull(points: np.ndarray) -> Triangulation:
    """scipy's Delaunay triangulation of ``points`` (Qhull), for a point set without a saved
    one. scipy is loaded here only: a shipped table never needs it."""
    from scipy.spatial import Delaunay

    tri = Delaunay(points)
    return Triangulation(points=points, simplices=tri.simplices.astype(np.int64),
                         neighbors=tri.neighbors.astype(np.int64),
                         transform=np.array(tri.transform, dtype=np.float64))


@functools.lru_cache(maxsize=32)
def _cached(digest: str, raw: bytes, n: int) -> Triangulation:
    points = np.frombuffer(raw, dtype=np.float64).reshape(n, 3).copy()
    points.setflags(write=False)
    f = TRIANGULATION_DIR / f"{digest}.json"
    if f.exists():
        doc = parse_json(read_text_bounded(f, "JSON"), str(f))
        if doc.get("points_sha256") == digest:
            return _from_doc(points, doc)
    return _qhull(points)


def triangulation_of(points: np.ndarray) -> Triangulation:
    """The Delaunay triangulation of ``points`` (N, 3): the saved one (:data:`TRIANGULATION_DIR`)
    where there is one, else Qhull's, computed now."""
    p = np.ascontiguousarray(points, dtype=np.float64)
    return _cached(points_digest(p), p.tobytes(), len(p))


def save_triangulation(points: np.ndarray, folder: str | Path = TRIANGULATION_DIR) -> Path:
    """Triangulate ``points`` (Qhull) and save the result as ``<digest>.json`` in ``folder``
    (flat simplices' transforms as null). Returns its path."""
    p = np.ascontiguousarray(points, dtype=np.float64)
    tri = _qhull(p)
    t = tri.transform.reshape(len(tri.simplices), 12)
    doc = {"points_sha256": points_digest(p),
           "simplices": tri.simplices.tolist(), "neighbors": tri.neighbors.tolist(),
           "transform": [None if np.isnan(r[0]) else [float(v) for v in r] for r in t]}
    path = Path(folder) / f"{doc['points_sha256']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(doc, separators=(",", ":")) + "\n")
    return path
