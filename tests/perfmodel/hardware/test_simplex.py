"""Point location and nearest point in numpy (perfmodel.hardware.simplex) give what scipy gives."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial import Delaunay, cKDTree

from perfmodel.hardware import kernel_tables
from perfmodel.hardware.calibration import load_calibration
from perfmodel.hardware.simplex import (
    TRIANGULATION_DIR,
    interpolation_of,
    points_digest,
    save_triangulation,
)


def _shipped_point_sets() -> list[np.ndarray]:
    """Every point set a shipped table interpolates over (the H200 calibration's GEMMs, with
    and without the tile model, and the published kernel tables)."""
    cal = load_calibration("h200")
    tables = [cal.gemm_points, cal.gemm_points_plain,
              *(t.points for t in kernel_tables._tables().values())]
    sets = {}
    for table in tables:
        for pts, _ in table.values():
            p = np.ascontiguousarray(pts, dtype=np.float64)
            sets[p.tobytes()] = p
    return list(sets.values())


SHIPPED = _shipped_point_sets()


def _queries(pts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Points in and around the hull: uniform, on the half-integer lattice (on faces and
    edges of the measured grid), and midway between two measured points (ties)."""
    lo, hi = pts.min(axis=0) - 2, pts.max(axis=0) + 2
    i, j = rng.integers(0, len(pts), (2, 1500))
    return np.concatenate([rng.uniform(lo, hi, (1500, 3)),
                           np.round(rng.uniform(lo, hi, (1500, 3)) * 2) / 2,
                           (pts[i] + pts[j]) / 2, pts])


@pytest.mark.parametrize("k", range(len(SHIPPED)))
def test_shipped_point_sets_have_their_saved_scipy_triangulation(k):
    """A shipped table is interpolated without scipy: its triangulation and k-d tree are
    saved, and they are scipy's (same simplices, neighbours, transforms, tree)."""
    pts = SHIPPED[k]
    f = TRIANGULATION_DIR / f"{points_digest(pts)}.json"
    assert f.exists(), f"run perfmodel.hardware.simplex.save_triangulation on {len(pts)} points"
    assert json.loads(f.read_text())["points_sha256"] == points_digest(pts)
    tri, tree = interpolation_of(pts)
    ref = Delaunay(pts)
    assert np.array_equal(tri.simplices, ref.simplices)
    assert np.array_equal(tri.neighbors, ref.neighbors)
    assert np.array_equal(tri.transform, ref.transform, equal_nan=True)
    assert np.array_equal(tree.indices, cKDTree(pts).indices)


@pytest.mark.parametrize("k", range(len(SHIPPED)))
def test_location_and_nearest_point_are_scipys(k):
    pts = SHIPPED[k]
    q = _queries(pts, np.random.default_rng(k))
    tri, tree = interpolation_of(pts)
    assert np.array_equal(tri.find_simplex(q), Delaunay(pts).find_simplex(q, bruteforce=True))
    assert np.array_equal(tree.query(q), cKDTree(pts).query(q)[1])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(5, 40), grid=st.booleans())
def test_unsaved_point_sets_match_scipy(seed, n, grid):
    """A point set without a saved triangulation (a user's folder) is triangulated by scipy
    on first use and located in numpy: same simplex, same nearest point, ties included."""
    rng = np.random.default_rng(seed)
    pts = (rng.integers(0, 4, (n, 3)) if grid else rng.uniform(0, 4, (n, 3))).astype(float)
    pts = np.unique(pts, axis=0)
    tri, tree = interpolation_of(pts)
    q = _queries(pts, rng)[::10]
    assert np.array_equal(tree.query(q), cKDTree(pts).query(q)[1])
    if tri is not None:
        assert np.array_equal(tri.find_simplex(q),
                              Delaunay(pts).find_simplex(q, bruteforce=True))


def test_unit_tetrahedron_by_hand(tmp_path):
    """Corners (0,0,0), (1,0,0), (0,1,0), (0,0,1): (0.2, 0.3, 0.1) lies in the one simplex;
    (2, 0, 0) lies outside and its nearest corner is (1, 0, 0) (distance 1)."""
    pts = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]], dtype=float)
    path = save_triangulation(pts, tmp_path)
    assert path.name == f"{points_digest(pts)}.json"
    tri, tree = interpolation_of(pts)
    assert tri.find_simplex(np.array([[0.2, 0.3, 0.1], [2.0, 0.0, 0.0]])).tolist() == [0, -1]
    assert tree.query(np.array([[2.0, 0.0, 0.0], [0.1, 0.1, 0.9]])).tolist() == [1, 3]


def test_coplanar_points_have_no_triangulation():
    pts = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0]], dtype=float)
    tri, tree = interpolation_of(pts)
    assert tri is None
    assert tree.query(np.array([[0.9, 0.8, 5.0]])).tolist() == [3]
