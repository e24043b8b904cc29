"""The graphs equal the reference GraphCast's, index for index (fixture: 5.625 deg, levels 0..2).

See tests/fixtures/graphcast_5p625/README.md for the fixture's index spaces.
Mesh nodes are compared in the reference's order (no mapping needed), grid nodes
in the grid's order; edge sets as sets of (sender, receiver) pairs, since
wnscale sorts edges by receiver.
"""

import os

import numpy as np
import pytest

from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.graphs import build, features, grid, icosahedron
from wnscale.graphs.points import PointSet
from wnscale.model import setup

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "graphcast_5p625", "graphs.npz")
MESH_TO_GRID_NORMALIZATION = 0.6180338738074472  # the fixture's ModelConfig value


@pytest.fixture(scope="module")
def reference():
  with np.load(FIXTURE) as f:
    return dict(f)


@pytest.fixture(scope="module")
def graphs():
  """Built as training builds them, from a config with the fixture's model settings."""
  config = config_lib.default_config()
  config.model.update(mesh_levels=2, radius_fraction=0.6,
                      mesh_to_grid_edge_normalization=MESH_TO_GRID_NORMALIZATION)
  return setup.graphs_for_grid(specs_lib.from_config(config_lib.validate(config)).model,
                               PointSet.regular(*grid.regular_grid(5.625, include_poles=False)))


MESH_ANGLE_ATOL = 2e-5  # degrees: a few float32 ulps at 45-360 deg


def edge_rows(senders, receivers):
  """`{(sender, receiver): row}`; asserts there are no duplicate pairs."""
  rows = {pair: i for i, pair in enumerate(zip(senders.tolist(), receivers.tolist()))}
  assert len(rows) == len(senders)
  return rows


def test_grid_and_mesh_nodes(reference):
  mesh = icosahedron.mesh_hierarchy(2)[-1]
  # Same vertices in the same order, to float32 rounding (here: bit for bit).
  np.testing.assert_allclose(mesh.vertices, reference["mesh_node_positions"], rtol=0,
                             atol=2**-23)
  np.testing.assert_array_equal(mesh.faces, reference["finest_mesh_faces"])
  mesh_lat, mesh_lon = grid.xyz_to_lat_lon(mesh.vertices)
  # float32 angles of float32 vectors, as the reference computes them: numpy's float32
  # kernels differ by a few ulps between builds (numpy 2.4: up to 4 ulps, 1.5e-5 deg).
  np.testing.assert_allclose(mesh_lat, reference["mesh_node_lat"], atol=MESH_ANGLE_ATOL)
  np.testing.assert_allclose(mesh_lon, reference["mesh_node_lon"], atol=MESH_ANGLE_ATOL)
  latitude, longitude = grid.regular_grid(5.625, include_poles=False)
  grid_lat, grid_lon = grid.grid_lat_lon(latitude, longitude)
  np.testing.assert_array_equal(grid_lat.astype(np.float32), reference["grid_node_lat"])
  np.testing.assert_array_equal(grid_lon.astype(np.float32), reference["grid_node_lon"])


def test_node_features(graphs, reference):
  np.testing.assert_allclose(graphs.nodes["grid"].features, reference["grid_node_features"],
                             rtol=0, atol=1e-6)
  np.testing.assert_allclose(graphs.nodes["mesh"].features, reference["mesh_node_features"],
                             rtol=0, atol=1e-6)


@pytest.mark.parametrize("name, key", [("grid_to_mesh", "grid2mesh"), ("mesh", "mesh")])
def test_edge_sets_and_features(graphs, reference, name, key):
  edges = graphs.edges[name]
  rows = edge_rows(edges.senders, edges.receivers)
  expected = edge_rows(reference[f"{key}_senders"], reference[f"{key}_receivers"])
  assert rows.keys() == expected.keys()
  order = [rows[pair] for pair in expected]
  # Grid-to-mesh features move most with the mesh nodes' float32 angles (above): by up
  # to 3e-6 at numpy 2.4, each edge being short against the longest one they divide by.
  np.testing.assert_allclose(edges.features[order], reference[f"{key}_edge_features"][
      list(expected.values())], rtol=0, atol={"grid2mesh": 4e-6, "mesh": 1e-6}[key])


def test_mesh_to_grid_outside_ties(graphs, reference):
  """Same 3 mesh nodes per grid node, in the same (face) order, except at the ties:
  grid nodes on a mesh edge, where the reference's pick depends on float rounding."""
  m2g = graphs.edges["mesh_to_grid"]
  num_grid = graphs.num_nodes("grid")
  np.testing.assert_array_equal(m2g.receivers, np.repeat(np.arange(num_grid), 3))
  np.testing.assert_array_equal(reference["mesh2grid_receivers"], m2g.receivers)
  ours = m2g.senders.reshape(num_grid, 3)
  theirs = reference["mesh2grid_senders"].reshape(num_grid, 3)
  ties = np.zeros(num_grid, bool)
  ties[reference["tie_grid_indices"]] = True
  np.testing.assert_array_equal(ours[~ties], theirs[~ties])
  # At a tie both picks are faces holding the node.
  faces = {tuple(f) for f in reference["finest_mesh_faces"].tolist()}
  assert all(tuple(f) in faces for f in ours[ties].tolist())
  # Features per edge, outside the ties, with the fixture's normalization factor.
  keep = np.repeat(~ties, 3)
  np.testing.assert_allclose(m2g.features[keep],
                             reference["mesh2grid_edge_features"][keep], rtol=0, atol=1e-6)


def test_normalization_factors(reference):
  """Unnormalized lengths: the longest grid-to-mesh and mesh edges are the reference's
  factors; with normalization 0 (the reference's None) mesh-to-grid is divided by its
  longest edge, so its longest length is 1 and the rest scale accordingly."""
  latitude, longitude = grid.regular_grid(5.625, include_poles=False)
  grid_lat_lon = grid.grid_lat_lon(latitude.astype(np.float32), longitude.astype(np.float32))
  mesh_lat_lon = grid.xyz_to_lat_lon(icosahedron.mesh_hierarchy(2)[-1].vertices)
  for key, senders_lat_lon, receivers_lat_lon in [
      ("grid2mesh", grid_lat_lon, mesh_lat_lon), ("mesh", mesh_lat_lon, mesh_lat_lon)]:
    raw = features.edge_features(grid.lat_lon_to_xyz(*senders_lat_lon),
                                 grid.lat_lon_to_xyz(*receivers_lat_lon), *receivers_lat_lon,
                                 reference[f"{key}_senders"], reference[f"{key}_receivers"],
                                 normalization=1.0)
    np.testing.assert_allclose(raw[:, 0].max(), reference[f"{key}_edge_normalization"],
                               rtol=1e-6)
  np.testing.assert_allclose(reference["mesh2grid_edge_normalization"],
                             MESH_TO_GRID_NORMALIZATION, rtol=1e-15)
  # The None path: divided by the longest edge, whatever the reference's factor was.
  graphs = build.build_graphs(PointSet.regular(latitude, longitude), mesh_levels=2,
                              use_cache=False)
  m2g = graphs.edges["mesh_to_grid"]
  raw = features.edge_features(grid.lat_lon_to_xyz(*mesh_lat_lon),
                               grid.lat_lon_to_xyz(*grid_lat_lon), *grid_lat_lon,
                               m2g.senders, m2g.receivers, normalization=1.0)
  assert m2g.features[:, 0].max() == 1.0
  np.testing.assert_allclose(m2g.features, raw / raw[:, 0].max(), rtol=0, atol=3e-7)
  ties = np.zeros(len(grid_lat_lon[0]), bool)
  ties[reference["tie_grid_indices"]] = True
  keep = np.repeat(~ties, 3)
  np.testing.assert_allclose(raw[keep] / MESH_TO_GRID_NORMALIZATION,
                             reference["mesh2grid_edge_features"][keep], rtol=0, atol=1e-6)
