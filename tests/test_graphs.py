"""Static graphs: GraphCast's published counts and the properties the model relies on."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import spatial

from wnscale.graphs import blocks, build, connectivity, features, grid, icosahedron
from wnscale.graphs.edge_sets import graphcast_edge_sets
from wnscale.graphs.points import PointSet, named_grid

from mesh_ties import tied_grid_nodes

REPO = os.path.join(os.path.dirname(__file__), "..")


@pytest.fixture(scope="module")
def graphs_0p25():
  return build.build_graphs(PointSet.regular(*grid.regular_grid(0.25, include_poles=True)),
                            mesh_levels=6)


def test_multi_mesh_counts_match_graphcast():
  meshes = icosahedron.mesh_hierarchy(6)
  assert [len(m.vertices) for m in meshes] == [10 * 4**k + 2 for k in range(7)]
  senders, receivers = icosahedron.multi_mesh_edges(meshes)
  assert len(meshes[-1].vertices) == 40_962
  assert len(senders) == 327_660
  pairs = set(zip(senders.tolist(), receivers.tolist()))
  assert len(pairs) == len(senders)  # levels never share an edge
  assert all((r, s) in pairs for s, r in pairs)  # both directions
  assert np.all(np.diff(receivers) >= 0)


def test_icosahedron_has_a_face_at_each_pole():
  mesh = icosahedron.icosahedron()
  np.testing.assert_allclose(np.linalg.norm(mesh.vertices, axis=1), 1, atol=1e-7)
  assert np.abs(mesh.vertices[:, 2]).max() < 0.8  # no vertex near a pole
  centroids = mesh.vertices[mesh.faces].mean(axis=1)
  directions = centroids / np.linalg.norm(centroids, axis=1, keepdims=True)
  np.testing.assert_allclose(sorted(directions[:, 2])[::19], [-1, 1], atol=1e-6)


@pytest.mark.parametrize("levels", [0, 3, 6])
def test_mesh_is_convex(levels):
  """The mesh-to-grid fast path relies on it. A closed surface is convex when it is
  locally so: no vertex of the faces around a face lies above that face's plane."""
  mesh = icosahedron.mesh_hierarchy(levels)[-1]
  v = mesh.vertices.astype(np.float64)
  a, b, c = (v[mesh.faces[:, k]] for k in range(3))
  normals = np.cross(b - a, c - a)
  normals /= np.linalg.norm(normals, axis=1, keepdims=True)
  around = connectivity._faces_around_vertices(mesh.faces, len(v))  # [V, max degree]
  neighbours = around[mesh.faces].reshape(len(mesh.faces), -1)  # [F, 3 * max degree]
  corners = v[mesh.faces[neighbours]]  # [F, k, 3, 3]
  heights = np.einsum("fj,fkcj->fkc", normals, corners - a[:, None, None])
  assert heights.max() < 1e-12  # the face's own vertices are at ~1e-17


def test_0p25_degree_counts_match_graphcast(graphs_0p25):
  counts = graphs_0p25.counts()
  assert counts["grid_nodes"] == 721 * 1440 == 1_038_240
  assert counts["mesh_nodes"] == 40_962
  assert counts["mesh_edges"] == 327_660
  assert counts["mesh_to_grid_edges"] == 3 * 1_038_240
  # The reference's count, exactly: wnscale reproduces its float32 positions and
  # radius bit for bit. Float rounding could matter only at the radius, where 4
  # pairs lie within 1e-8 (chord) and 49 within 1e-7 of it.
  assert counts["grid_to_mesh_edges"] == 1_618_818


def test_1_degree_grid_to_mesh_count_matches_graphcast():
  graphs = build.build_graphs(PointSet.regular(*grid.regular_grid(1.0, include_poles=True)),
                              mesh_levels=5)
  assert graphs.counts()["grid_to_mesh_edges"] == 101_892  # the reference's, same pairs


GRIDS = {  # (points, mesh levels)
    "wb2_5p625_no_poles": (PointSet.regular(*grid.regular_grid(5.625, include_poles=False)), 2),
    "2p8125_poles": (PointSet.regular(*grid.regular_grid(2.8125, include_poles=True)), 3),
    "1p0_descending": (PointSet.regular(grid.regular_grid(1.0, True)[0][::-1],
                                        grid.regular_grid(1.0)[1]), 4),
    "octahedral_O24": (named_grid("O24"), 3),
}


@pytest.mark.parametrize("name", GRIDS)
def test_graph_properties(name):
  points, levels = GRIDS[name]
  graphs = build.build_graphs(points, levels)
  num_grid, num_mesh = graphs.num_nodes("grid"), graphs.num_nodes("mesh")
  assert num_grid == points.size
  # Every grid node has exactly 3 mesh-to-grid edges, from distinct mesh nodes.
  m2g = graphs.edges["mesh_to_grid"]
  assert np.all(np.bincount(m2g.receivers, minlength=num_grid) == 3)
  assert np.all(np.diff(np.sort(m2g.senders.reshape(-1, 3), axis=1), axis=1) > 0)
  # Every mesh node gets at least one grid-to-mesh edge.
  assert np.all(np.bincount(graphs.edges["grid_to_mesh"].receivers, minlength=num_mesh) >= 1)
  for edges, num_senders, num_receivers in [
      (graphs.edges["grid_to_mesh"], num_grid, num_mesh),
      (graphs.edges["mesh"], num_mesh, num_mesh),
      (m2g, num_mesh, num_grid)]:
    assert edges.senders.max() < num_senders and edges.receivers.max() < num_receivers
    assert np.all(np.diff(edges.receivers) >= 0)  # sorted by receiver
    features = edges.features
    assert features.shape == (len(edges.senders), 4) and np.all(np.isfinite(features))
    assert np.isclose(features[:, 0].max(), 1.0)  # normalized by the longest edge
    assert np.all(np.abs(features) <= 1.0 + 1e-6)
    np.testing.assert_allclose(np.linalg.norm(features[:, 1:], axis=1), features[:, 0],
                               atol=1e-6)
  for node_features in (graphs.nodes["grid"].features, graphs.nodes["mesh"].features):
    np.testing.assert_allclose(node_features[:, 1]**2 + node_features[:, 2]**2, 1, atol=1e-6)


def test_mesh_to_grid_triangle_contains_the_grid_node():
  latitude, longitude = grid.regular_grid(5.625, include_poles=False)
  mesh = icosahedron.mesh_hierarchy(2)[-1]
  points = grid.lat_lon_to_xyz(*grid.grid_lat_lon(latitude, longitude))
  senders, _ = connectivity.mesh_to_grid_edges(points, mesh)
  corners = mesh.vertices[senders.reshape(-1, 3)].astype(np.float64)  # [grid, 3, 3]
  # The point is a non-negative combination of its triangle's corners.
  weights = np.linalg.solve(np.swapaxes(corners, 1, 2), points[..., None])[..., 0]
  assert np.all(weights >= -1e-7)


@pytest.mark.parametrize("resolution, levels", [(2.8125, 3), (1.0, 4)])
def test_mesh_to_grid_fast_path_is_the_closest_face(resolution, levels):
  """Searching every grid node's neighbourhood for the closest flat face gives the
  face that `mesh_to_grid_edges` picks, except for nodes on an edge (ties)."""
  latitude, longitude = grid.regular_grid(resolution, include_poles=True)
  mesh = icosahedron.mesh_hierarchy(levels)[-1]
  points = grid.lat_lon_to_xyz(*grid.grid_lat_lon(latitude, longitude))
  senders, _ = connectivity.mesh_to_grid_edges(points, mesh)
  face_of = {tuple(f): i for i, f in enumerate(mesh.faces.tolist())}
  chosen = np.array([face_of[tuple(f)] for f in senders.reshape(-1, 3).tolist()])
  searched = connectivity._closest_faces(points, chosen, mesh.vertices.astype(np.float64),
                                         mesh.faces)
  corners = mesh.vertices[mesh.faces[chosen]].astype(np.float64)
  edge_planes = np.cross(corners, np.roll(corners, -1, axis=1))
  edge_planes /= np.linalg.norm(edge_planes, axis=-1, keepdims=True)
  on_edge = np.abs(np.einsum("nej,nj->ne", edge_planes, points)).min(axis=1) < 1e-6
  assert on_edge.sum() < 0.05 * len(points)
  np.testing.assert_array_equal(searched[~on_edge], chosen[~on_edge])


@pytest.mark.parametrize("points", [PointSet.regular(*grid.regular_grid(2.8125)),
                                    named_grid("O32")], ids=["regular", "O32"])
def test_grid_to_mesh_edges_are_every_pair_within_the_radius(points):
  """The radius query (the reference's `query_ball_point`, on every core) gives exactly
  the pairs of scipy's pairwise-distance query (the path before it), in receiver, then
  sender order: with GraphCast's one radius and with a radius of each mesh node's own."""
  mesh = icosahedron.mesh_hierarchy(3)[-1]
  xyz = grid.lat_lon_to_xyz(points.latitude.astype(np.float32),
                            points.longitude.astype(np.float32))
  radius = connectivity.max_edge_length(mesh) * np.float32(0.6)
  wobble = 1 + 0.2 * np.abs(np.sin(np.arange(len(mesh.vertices))))
  for chosen in (radius, (radius * wobble).astype(np.float32)):
    senders, receivers = connectivity.grid_to_mesh_edges(xyz, mesh, chosen)
    pairs = spatial.cKDTree(mesh.vertices).sparse_distance_matrix(
        spatial.cKDTree(xyz), float(np.max(chosen)), output_type="ndarray")
    pairs = pairs[pairs["v"] <= np.broadcast_to(chosen, (len(mesh.vertices),))[pairs["i"]]]
    order = np.lexsort((pairs["j"], pairs["i"]))
    assert len(senders) > len(mesh.vertices)
    np.testing.assert_array_equal(senders, pairs["j"][order])
    np.testing.assert_array_equal(receivers, pairs["i"][order])


@pytest.mark.parametrize("regional", [0, 2], ids=["uniform", "regional"])
def test_the_nearest_vertex_shortcut_gives_the_faces_of_the_search(monkeypatch, regional):
  """A point clearly inside a face around its nearest vertex takes that face without the
  nearest-centroid search; the search alone (the path before the shortcut) gives the same
  edges and ties, for grid nodes and for points on the mesh's vertices and edges, on a
  uniform mesh and on one refined further over a cap."""
  lat, lon = (a.astype(np.float32) for a in grid.grid_lat_lon(*grid.regular_grid(2.8125)))
  meshes = icosahedron.mesh_hierarchy(3, lambda xyz: xyz[:, 2] > 0.6, regional)
  mesh = meshes[-1]
  coarse = meshes[1]
  on_mesh = np.concatenate([coarse.vertices, coarse.vertices[coarse.faces[:, :2]].mean(axis=1)])
  xyz = np.concatenate([grid.lat_lon_to_xyz(lat, lon),
                        on_mesh / np.linalg.norm(on_mesh, axis=1, keepdims=True)])
  shortcut = connectivity.mesh_to_grid_edges(xyz, mesh), tied_grid_nodes(xyz, mesh)
  monkeypatch.setattr(connectivity, "_CLEARLY_INSIDE", np.inf)  # no point is: all searched
  searched = connectivity.mesh_to_grid_edges(xyz, mesh), tied_grid_nodes(xyz, mesh)
  for got, expected in zip((*shortcut[0], shortcut[1]), (*searched[0], searched[1])):
    np.testing.assert_array_equal(got, expected)
  assert 0 < shortcut[1].sum() < len(xyz) // 4  # the points on edges are ties


def test_blocks_in_threads_give_the_arrays_of_one_block(monkeypatch):
  """The mesh-to-grid search and the edge features work on blocks of rows in threads:
  small blocks on 4 threads give the arrays of one block in this thread, bit for bit."""
  monkeypatch.setattr(blocks, "cores", lambda: 4)
  lat, lon = (a.astype(np.float32) for a in grid.grid_lat_lon(*grid.regular_grid(2.8125)))
  xyz = grid.lat_lon_to_xyz(lat, lon)
  mesh = icosahedron.mesh_hierarchy(3)[-1]
  whole = connectivity.mesh_to_grid_edges(xyz, mesh, block=len(xyz))
  for got, expected in zip(connectivity.mesh_to_grid_edges(xyz, mesh, block=1000), whole):
    np.testing.assert_array_equal(got, expected)
  mesh_lat, mesh_lon = grid.xyz_to_lat_lon(mesh.vertices)
  arguments = (grid.lat_lon_to_xyz(mesh_lat, mesh_lon), xyz, lat, lon, *whole)
  np.testing.assert_array_equal(features.edge_features(*arguments, block=999),
                                features.edge_features(*arguments, block=len(whole[0])))
  with pytest.raises(ZeroDivisionError):  # a block's error reaches the caller
    blocks.for_blocks(10, 3, lambda rows: rows.start // (rows.start - 6))


def test_closest_points_on_triangles():
  """Against a dense sampling of each triangle, from points on every side of it."""
  rng = np.random.default_rng(0)
  corners = rng.normal(size=(50, 3, 3))
  points = rng.normal(size=(50, 3)) * 2
  closest = connectivity.closest_points_on_triangles(points, corners)
  u, v = np.meshgrid(np.linspace(0, 1, 201), np.linspace(0, 1, 201))
  keep = u + v <= 1
  weights = np.stack([1 - u[keep] - v[keep], u[keep], v[keep]], axis=1)  # [samples, 3]
  samples = np.einsum("sk,nkj->nsj", weights, corners)
  sampled = np.linalg.norm(samples - points[:, None], axis=-1).min(axis=1)
  exact = np.linalg.norm(closest - points, axis=-1)
  assert np.all(exact <= sampled + 1e-12)
  np.testing.assert_allclose(exact, sampled, atol=0.02)


def test_edge_features_in_the_receiver_frame():
  """A receiver at latitude 0, longitude 0 is its own frame: the features are the
  plain displacement sender - receiver (and its length), / normalization."""
  lat = np.array([10.0, 0.0], np.float32)
  lon = np.array([5.0, 0.0], np.float32)
  xyz = grid.lat_lon_to_xyz(lat, lon)
  f = features.edge_features(xyz, xyz, lat, lon, np.array([0]), np.array([1]),
                             normalization=2.0)
  xyz = xyz.astype(np.float64)
  np.testing.assert_allclose(f[0, 1:], (xyz[0] - xyz[1]) / 2.0, atol=1e-7)
  np.testing.assert_allclose(f[0, 0], np.linalg.norm(xyz[0] - xyz[1]) / 2.0, atol=1e-7)


def test_edge_features_are_invariant_to_longitude_shifts():
  """The receiver's frame is defined by its latitude and longitude, so shifting every
  longitude (rotating the sphere about the polar axis) leaves the features unchanged.
  A general rotation of the sphere does change them (the frame's "up" is north);
  that is the reference's definition, and the test checks that too."""
  rng = np.random.default_rng(1)
  lat = rng.uniform(-89, 89, 40).astype(np.float32)
  lon = rng.uniform(0, 360, 40).astype(np.float32)
  senders, receivers = rng.integers(0, 40, 200), rng.integers(0, 40, 200)
  def edge_features(lat, lon):  # every node both a sender and a receiver
    xyz = grid.lat_lon_to_xyz(lat, lon)
    return features.edge_features(xyz, xyz, lat, lon, senders, receivers)
  original = edge_features(lat, lon)
  shifted_lon = np.mod(lon + np.float32(rng.uniform(0, 360)), 360).astype(np.float32)
  shifted = edge_features(lat, shifted_lon)
  np.testing.assert_allclose(shifted, original, atol=1e-5)
  # A rotation about the x axis moves the poles: the local frames turn, features change.
  xyz = grid.lat_lon_to_xyz(lat.astype(np.float64), lon.astype(np.float64))
  angle = 0.7
  rotation = np.array([[1, 0, 0], [0, np.cos(angle), -np.sin(angle)],
                       [0, np.sin(angle), np.cos(angle)]])
  rotated_lat, rotated_lon = (a.astype(np.float32)
                              for a in grid.xyz_to_lat_lon(xyz @ rotation.T))
  rotated = edge_features(rotated_lat, rotated_lon)
  # Lengths are rotation invariant; the displacement components are not.
  np.testing.assert_allclose(rotated[:, 0], original[:, 0], atol=1e-5)
  assert np.abs(rotated[:, 1:] - original[:, 1:]).max() > 0.1


def test_mesh_too_fine_for_grid_is_a_clear_error():
  points = PointSet.regular(*grid.regular_grid(5.625, include_poles=False))
  with pytest.raises(ValueError, match="mesh is too fine for the grid.*fewer mesh refinements"):
    build.build_graphs(points, mesh_levels=5, use_cache=False)


def test_cache_is_keyed_by_parameters(tmp_path, monkeypatch):
  monkeypatch.setenv("WNSCALE_CACHE_DIR", str(tmp_path))
  points = PointSet.regular(*grid.regular_grid(5.625, include_poles=False))
  first = build.build_graphs(points, 2)
  assert len(os.listdir(tmp_path / "graphs")) == 1
  again = build.build_graphs(points, 2)
  for a, b in zip(build._flatten(first).values(), build._flatten(again).values()):
    np.testing.assert_array_equal(a, b)
  build.build_graphs(points, 2, graphcast_edge_sets(radius_fraction=0.7))
  build.build_graphs(points, 2, graphcast_edge_sets(mesh_to_grid_normalization=0.6))
  build.build_graphs(points, 1)
  # Other points, the same edge sets: another graph. Other areas: the same graph.
  build.build_graphs(named_grid("O8"), 1)
  build.build_graphs(PointSet(points.latitude, points.longitude, np.ones(points.size),
                              "equal areas", points.field_shape), 1)
  assert len([f for f in os.listdir(tmp_path / "graphs") if f.endswith(".npz")]) == 5


def test_graph_info_json(tmp_path):
  """Counts; built into an empty cache, then read from it (and said so)."""
  infos = []
  for _ in range(2):
    result = subprocess.run(
        [sys.executable, "-m", "launch.graph_info", "--config=configs/tiny.py", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, JAX_PLATFORMS="cpu", WNSCALE_CACHE_DIR=str(tmp_path)))
    assert result.returncode == 0, result.stderr
    infos.append(json.loads(result.stdout.strip().splitlines()[-1]))
  built, read = infos
  assert built["grid_nodes"] == 32 * 64
  assert built["mesh_nodes"] == 162
  assert set(built) >= {"grid_nodes", "mesh_nodes", "grid_to_mesh_edges", "mesh_edges",
                        "mesh_to_grid_edges"}
  assert not built["from_cache"] and "build_seconds" in built and "read_seconds" not in built
  assert read["from_cache"] and "read_seconds" in read and "build_seconds" not in read
  assert {k: v for k, v in read.items() if k.endswith("edges") or k.endswith("nodes")} == {
      k: v for k, v in built.items() if k.endswith("edges") or k.endswith("nodes")}
