"""Static graphs: GraphCast's published counts and the properties the model relies on."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from wnscale.graphs import build, connectivity, grid, icosahedron

REPO = os.path.join(os.path.dirname(__file__), "..")


@pytest.fixture(scope="module")
def graphs_0p25():
  latitude, longitude = grid.regular_grid(0.25, include_poles=True)
  return build.build_graphs(latitude, longitude, mesh_levels=6)


def test_multi_mesh_counts_match_graphcast():
  meshes = icosahedron.mesh_hierarchy(6)
  assert [len(m.vertices) for m in meshes] == [10 * 4**k + 2 for k in range(7)]
  senders, receivers = icosahedron.multi_mesh_edges(meshes)
  assert len(meshes[-1].vertices) == 40_962
  assert len(senders) == 327_660
  pairs = set(zip(senders.tolist(), receivers.tolist()))
  assert len(pairs) == len(senders)  # de-duplicated
  assert all((r, s) in pairs for s, r in list(pairs)[:1000])  # both directions
  assert np.all(np.diff(receivers) >= 0)


def test_0p25_degree_counts_match_graphcast(graphs_0p25):
  counts = graphs_0p25.counts()
  assert counts["grid_nodes"] == 721 * 1440 == 1_038_240
  assert counts["mesh_nodes"] == 40_962
  assert counts["mesh_edges"] == 327_660
  assert counts["mesh_to_grid_edges"] == 3 * 1_038_240
  # GraphCast reports ~1.6 M grid-to-mesh edges at 0.6 x the longest edge.
  assert 1.55e6 < counts["grid_to_mesh_edges"] < 1.7e6


GRIDS = {
    "wb2_5p625_no_poles": grid.regular_grid(5.625, include_poles=False) + (2,),
    "2p8125_poles": grid.regular_grid(2.8125, include_poles=True) + (3,),
    "1p0_descending": (grid.regular_grid(1.0, True)[0][::-1], grid.regular_grid(1.0)[1], 4),
}


@pytest.mark.parametrize("name", GRIDS)
def test_graph_properties(name):
  latitude, longitude, levels = GRIDS[name]
  graphs = build.build_graphs(latitude, longitude, levels)
  num_grid, num_mesh = graphs.num_grid_nodes, graphs.num_mesh_nodes
  assert num_grid == len(latitude) * len(longitude)
  # Every grid node has exactly 3 mesh-to-grid edges, from distinct mesh nodes.
  m2g = graphs.mesh_to_grid
  assert np.all(np.bincount(m2g.receivers, minlength=num_grid) == 3)
  assert np.all(np.diff(np.sort(m2g.senders.reshape(-1, 3), axis=1), axis=1) > 0)
  # Every mesh node gets at least one grid-to-mesh edge.
  assert np.all(np.bincount(graphs.grid_to_mesh.receivers, minlength=num_mesh) >= 1)
  for edges, num_senders, num_receivers in [
      (graphs.grid_to_mesh, num_grid, num_mesh), (graphs.mesh, num_mesh, num_mesh),
      (m2g, num_mesh, num_grid)]:
    assert edges.senders.max() < num_senders and edges.receivers.max() < num_receivers
    assert np.all(np.diff(edges.receivers) >= 0)  # sorted by receiver
    features = edges.features
    assert features.shape == (len(edges.senders), 4) and np.all(np.isfinite(features))
    assert np.isclose(features[:, 0].max(), 1.0)  # normalized by the longest edge
    assert np.all(np.abs(features) <= 1.0 + 1e-6)
    np.testing.assert_allclose(np.linalg.norm(features[:, 1:], axis=1), features[:, 0],
                               atol=1e-6)
  for node_features in (graphs.grid_node_features, graphs.mesh_node_features):
    np.testing.assert_allclose(node_features[:, 1]**2 + node_features[:, 2]**2, 1, atol=1e-6)


def test_mesh_to_grid_triangle_contains_the_grid_node():
  latitude, longitude = grid.regular_grid(5.625, include_poles=False)
  mesh = icosahedron.mesh_hierarchy(2)[-1]
  points = grid.lat_lon_to_xyz(*grid.grid_lat_lon(latitude, longitude))
  senders, _ = connectivity.mesh_to_grid_edges(points, mesh)
  corners = mesh.vertices[senders.reshape(-1, 3)]  # [grid, 3, 3]
  # The point is a non-negative combination of its triangle's corners.
  weights = np.linalg.solve(np.swapaxes(corners, 1, 2), points[..., None])[..., 0]
  assert np.all(weights >= -1e-9)


def test_edge_features_are_rotation_invariant_for_the_receiver():
  # A receiver on the equator at lon 0 is already in its own frame.
  sender = grid.lat_lon_to_xyz(np.array([10.0]), np.array([5.0]))
  receiver = grid.lat_lon_to_xyz(np.array([0.0]), np.array([0.0]))
  from wnscale.graphs import features
  f = features.edge_features(sender, receiver)
  np.testing.assert_allclose(f[0, 1:], (sender - receiver)[0] / np.linalg.norm(sender - receiver),
                             atol=1e-6)


def test_mesh_too_fine_for_grid_is_a_clear_error():
  latitude, longitude = grid.regular_grid(5.625, include_poles=False)
  with pytest.raises(ValueError, match="mesh is too fine for the grid.*fewer mesh refinements"):
    build.build_graphs(latitude, longitude, mesh_levels=5, use_cache=False)


def test_cache_is_keyed_by_parameters(tmp_path, monkeypatch):
  monkeypatch.setenv("WNSCALE_CACHE_DIR", str(tmp_path))
  latitude, longitude = grid.regular_grid(5.625, include_poles=False)
  first = build.build_graphs(latitude, longitude, 2)
  assert len(os.listdir(tmp_path / "graphs")) == 1
  again = build.build_graphs(latitude, longitude, 2)
  for a, b in zip(build._flatten(first).values(), build._flatten(again).values()):
    np.testing.assert_array_equal(a, b)
  build.build_graphs(latitude, longitude, 2, radius_fraction=0.7)
  build.build_graphs(latitude, longitude, 1)
  assert len([f for f in os.listdir(tmp_path / "graphs") if f.endswith(".npz")]) == 3


def test_graph_info_json():
  result = subprocess.run(
      [sys.executable, "-m", "launch.graph_info", "--config=configs/tiny.py", "--json"],
      cwd=REPO, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr
  info = json.loads(result.stdout.strip().splitlines()[-1])
  assert info["grid_nodes"] == 32 * 64
  assert info["mesh_nodes"] == 162
  assert set(info) >= {"grid_nodes", "mesh_nodes", "grid_to_mesh_edges", "mesh_edges",
                       "mesh_to_grid_edges"}
