"""Limited-area cut-outs: a fine regional store cut into a global one (`graphs.region`,
`data.reading.cutout`): which points are kept, the mask, the areas and loss weights, the joined
store's reads, bad input; then a 1 deg box cut into the tiny run's 5.625 deg store trains,
forecasts on the joined points and is scored on its region (launch.train, launch.forecast,
launch.evaluate --region). Sharded equals plain on a cut-out: test_sharding.py."""

import json
import os
import re

import numpy as np
import pytest
import xarray as xr
from scipy import spatial

from test_forecast_end_to_end import run as launch
from tiny_runs import losses, run
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.data.making import synthetic
from wnscale.data.reading import store_formats
from wnscale.errors import ArgumentError, UserError
from wnscale.evaluation import datasets, scoring
from wnscale.graphs import build, connectivity, grid, icosahedron
from wnscale.graphs import region as region_lib
from wnscale.graphs.points import PointSet
from wnscale.model import setup

GLOBAL = PointSet.regular(*grid.regular_grid(5.625))  # 32 x 64, no pole rows
BOX = "40,60,0,30"
REGIONAL = synthetic.store_points(resolution=1.0, region=BOX)  # 20 x 30 cell centres
# The hull of the regional cell centres (40.5 .. 59.5 N, 0.5 .. 29.5 E; its great-circle
# edges bulge less than a degree) holds the global points of this box.
HULL_BOX = (40.5, 59.5, 0.5, 29.5)


def test_regional_points_replace_the_global_ones_inside_the_hull_or_a_box():
  assert REGIONAL.size == 600
  np.testing.assert_allclose(np.unique(REGIONAL.latitude), np.arange(40.5, 60, 1.0))
  for box, regional_box, global_box in ((None, None, HULL_BOX),
                                        ((45, 55, 5, 20), (45, 55, 5, 20), (45, 55, 5, 20))):
    points, outer_kept, inner_kept = region_lib.cut_out(GLOBAL, REGIONAL, box, "box.zarr")
    replaced = region_lib.in_box(GLOBAL.latitude, GLOBAL.longitude, global_box)
    np.testing.assert_array_equal(outer_kept, np.flatnonzero(~replaced))
    regional = (np.arange(REGIONAL.size) if regional_box is None else np.flatnonzero(
        region_lib.in_box(REGIONAL.latitude, REGIONAL.longitude, regional_box)))
    np.testing.assert_array_equal(inner_kept, regional)
    # Global points first, in their order, then the regional ones; the mask marks those.
    assert points.size == outer_kept.size + inner_kept.size
    np.testing.assert_array_equal(points.region, np.arange(points.size) >= outer_kept.size)
    np.testing.assert_array_equal(points.latitude[~points.region],
                                  GLOBAL.latitude[outer_kept])
    np.testing.assert_array_equal(points.longitude[points.region],
                                  REGIONAL.longitude[inner_kept])
    points.check_global()
    assert points.area.mean() == pytest.approx(1.0)
  assert (20, 6) == (np.sum(region_lib.in_box(GLOBAL.latitude, GLOBAL.longitude, HULL_BOX)),
                     np.sum(region_lib.in_box(GLOBAL.latitude, GLOBAL.longitude,
                                              (45, 55, 5, 20))))
  # The hull's areas: an inner regional cell is its 1 deg x 1 deg cell; the region's cells
  # together are the box and half the way out to the coarse points around it.
  points, _, _ = region_lib.cut_out(GLOBAL, REGIONAL, None, "box.zarr")
  steradians = points.area * 4 * np.pi / points.size
  lat, lon = points.latitude, points.longitude
  inner = points.region & (lat > 41) & (lat < 59) & (lon > 1) & (lon < 29)
  cell = np.deg2rad(1.0) * (np.sin(np.deg2rad(lat + 0.5)) - np.sin(np.deg2rad(lat - 0.5)))
  np.testing.assert_allclose(steradians[inner], cell[inner], rtol=3e-3)
  box = np.deg2rad(30) * (np.sin(np.deg2rad(60)) - np.sin(np.deg2rad(40)))
  assert box < steradians[points.region].sum() < 1.6 * box
  # The loss weighs the region's points by their areas times data.regional_loss_weight.
  config = config_lib.default_config()
  config.data.regional_path, config.data.regional_loss_weight = "box.zarr", 3.0
  data = specs_lib.from_config(config_lib.validate(config)).data
  weights = setup.make_constants(data, None, points, np.ones(12)).node_weights
  np.testing.assert_allclose(weights, np.where(points.region, 3.0, 1.0) * points.area,
                             rtol=1e-6)


def test_a_region_that_is_none_is_one_error():
  with pytest.raises(UserError, match=r"No point of the regional store box.zarr .* lies in "
                     r"the box -10,10,100,120 \(data.region\)"):
    region_lib.cut_out(GLOBAL, REGIONAL, (-10, 10, 100, 120), "box.zarr")
  with pytest.raises(UserError, match="The points of global.zarr do not lie within a "
                     "hemisphere"):
    region_lib.cut_out(GLOBAL, GLOBAL, None, "global.zarr")
  row = PointSet.from_points(np.zeros(5), np.arange(5.0), np.ones(5))
  with pytest.raises(UserError, match="span no area"):
    region_lib.cut_out(GLOBAL, row, None, "row.zarr")
  for text, message in (("40,60,0", "not a box lat0,lat1,lon0,lon1 in degrees"),
                        ("60,40,0,30", "needs -90 <= lat0 < lat1 <= 90"),
                        ("a,b,c,d", "not a box")):
    with pytest.raises(UserError, match=f"data.region={text}: .*{message}"):
      region_lib.parse_box(text, "data.region")
  config = config_lib.default_config()
  config.data.region = BOX
  with pytest.raises(UserError, match="data.region='40,60,0,30' needs data.regional_path"):
    config_lib.validate(config)
  # A box across longitude 0, eastwards from lon0.
  np.testing.assert_array_equal(region_lib.in_box(np.zeros(4), np.array([340, 355, 5, 20]),
                                                  (-10, 10, 350, 10)), [0, 1, 1, 0])


def solid_angles(vertices, faces) -> np.ndarray:
  """`[faces]` the spherical triangles' areas (Van Oosterom and Strackee)."""
  a, b, c = (vertices[faces[:, i]].astype(np.float64) for i in range(3))
  numerator = np.einsum("ij,ij->i", a, np.cross(b, c))
  denominator = 1 + np.einsum("ij,ij->i", a, b) + np.einsum("ij,ij->i", b, c) + np.einsum(
      "ij,ij->i", c, a)
  return 2 * np.arctan2(numerator, denominator)


def test_regional_mesh_levels_refine_the_mesh_inside_the_region_only():
  points, _, _ = region_lib.cut_out(GLOBAL, REGIONAL, None, "box.zarr")
  uniform = build.meshes_on(points, 2)
  meshes = build.meshes_on(points, 2, regional_mesh_levels=3)
  assert len(meshes) == 6
  for coarse, fine in zip(uniform, meshes):  # the uniform levels are unchanged
    np.testing.assert_array_equal(coarse.faces, fine.faces)
  finest = meshes[-1]
  # The finest mesh still tiles the sphere, faces counter-clockwise, each vertex once.
  areas = solid_angles(finest.vertices, finest.faces)
  assert np.all(areas > 0) and areas.sum() == pytest.approx(4 * np.pi, rel=1e-6)
  assert len(np.unique(np.round(finest.vertices, 6), axis=0)) == len(finest.vertices)
  # New vertices lie on faces over the region: within a level-2 face of it (~15 deg).
  new = finest.vertices[len(uniform[-1].vertices):]
  lat, lon = grid.xyz_to_lat_lon(new.astype(np.float64))
  assert len(new) > 100 and np.all((lat > 25) & (lat < 75))
  assert np.all((np.mod(lon + 20, 360) < 70))
  # Inside the region the edges are 8 times shorter than the uniform mesh's.
  senders, receivers = icosahedron.multi_mesh_edges(meshes)
  inside = region_lib.in_box(*grid.xyz_to_lat_lon(finest.vertices.astype(np.float64)),
                             (45, 55, 5, 25))
  near = [np.linalg.norm(finest.vertices[senders] - finest.vertices[receivers], axis=-1)[
      inside[receivers] & inside[senders]]]
  longest = connectivity.max_edge_length(uniform[-1])
  assert np.min(near[0]) == pytest.approx(longest / 8, rel=0.3)
  # The multi-mesh holds each edge once in each direction, no loops.
  pairs = set(zip(senders.tolist(), receivers.tolist()))
  assert len(pairs) == len(senders) and pairs == set(zip(receivers.tolist(), senders.tolist()))
  assert np.all(senders != receivers)
  # Each mesh node gathers from grid nodes near it: within 0.6 x its own faces' edges
  # (at least its nearest grid node); every grid node lies in a finest face.
  graphs = build.build_graphs(points, 2, use_cache=False, regional_mesh_levels=3)
  edges = graphs.edges["grid_to_mesh"]
  length = np.linalg.norm(points.xyz()[edges.senders] - finest.vertices[edges.receivers],
                          axis=-1)
  local = connectivity.local_edge_lengths(finest)[edges.receivers]
  nearest, _ = spatial.cKDTree(points.xyz()).query(finest.vertices)
  assert np.all(length <= np.maximum(0.6 * local, nearest[edges.receivers]) * (1 + 1e-5))
  assert graphs.num_edges("mesh_to_grid") == 3 * points.size
  with pytest.raises(UserError, match="model.regional_mesh_levels=1 refines the mesh in a "
                     "cut-out's region, and .* has none: set data.regional_path"):
    build.meshes_on(GLOBAL, 2, regional_mesh_levels=1)
  config = config_lib.default_config()
  config.model.regional_mesh_levels = 1
  with pytest.raises(UserError, match="model.regional_mesh_levels=1 refines a cut-out's "
                     "region: it needs data.regional_path"):
    config_lib.validate(config)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
  """A global 5.625 deg store of Jan 1-4 and a 1 deg box of Jan 3-6 (levels in another
  order and one more; no geopotential)."""
  root = tmp_path_factory.mktemp("cutout_stores")
  outer = synthetic.write_synthetic_store(
      str(root / "global.zarr"), start="2020-01-01", end="2020-01-04", levels=[500, 850],
      variables=["temperature", "geopotential", "2m_temperature"])
  inner = synthetic.write_synthetic_store(
      str(root / "box.zarr"), resolution=1.0, region=BOX, start="2020-01-03",
      end="2020-01-06", levels=[1000, 850, 500], variables=["temperature", "2m_temperature"],
      seed=1)
  return outer, inner


def test_the_joined_store_reads_both_stores_at_the_times_both_hold(stores):
  outer_path, inner_path = stores
  names, levels = ["temperature", "2m_temperature"], [850, 500]
  joined = store_formats.open_store(outer_path, names, levels, regional_path=inner_path)
  outer = store_formats.open_store(outer_path, names, levels)
  inner = store_formats.open_store(inner_path, names, levels)
  np.testing.assert_array_equal(joined.times, outer.times[8:])  # Jan 3 and 4
  np.testing.assert_array_equal(joined.times, inner.times[:8])
  _, outer_kept, _ = region_lib.cut_out(outer.points, inner.points, None, inner_path)
  assert joined.points.region.sum() == 600 and joined.num_grid_nodes == 2048 - 20 + 600
  state = joined.read_state([1, 6])
  expected = np.concatenate([outer.read_state([9, 14])[..., outer_kept],
                             inner.read_state([1, 6])], axis=-1)
  np.testing.assert_array_equal(state, expected)
  # A sharded layout's slots (-1: padding) and the statics take the same points.
  slots = np.array([5, -1, 2000, joined.num_grid_nodes - 1])
  np.testing.assert_array_equal(joined.read_state([1, 6], grid_index=slots),
                                np.where(slots >= 0, expected[..., slots], 0))
  statics = np.concatenate([outer.read_statics()[:, outer_kept], inner.read_statics()], -1)
  np.testing.assert_array_equal(joined.read_statics(), statics)
  # What a store lacks is one error naming it.
  with pytest.raises(UserError, match=f"Store {inner_path} lacks variable.*'geopotential'"):
    store_formats.open_store(outer_path, ["geopotential"], levels, regional_path=inner_path)
  with pytest.raises(UserError, match=rf"Level\(s\) \[1000\] hPa not in store {outer_path}"):
    store_formats.open_store(outer_path, names, [1000], regional_path=inner_path)


def test_scores_of_a_region_take_its_points_and_weights_and_a_truth_that_holds_them():
  """`datasets.restricted` and `on_forecast_points`, on small in-memory datasets."""
  points, _, _ = region_lib.cut_out(GLOBAL, REGIONAL, None, "box.zarr")
  values = np.arange(points.size, dtype=np.float64)
  on_points = xr.Dataset({"2m_temperature": (("time", "values"), values[None])}, coords={
      "latitude": ("values", points.latitude), "longitude": ("values", points.longitude),
      "region": ("values", points.region), "cell_area": ("values", points.area)})
  forecast = datasets.Forecast("f.zarr", on_points, ("2m_temperature",))
  inside, weights = datasets.restricted(forecast, datasets.CUTOUT)
  np.testing.assert_array_equal(inside.dataset["2m_temperature"].values[0],
                                values[points.region])
  np.testing.assert_array_equal(weights.values, points.area[points.region])
  # The regional store (a regular box, latitude descending) as the region's truth.
  lat, lon = np.arange(59.5, 40, -1.0), np.arange(0.5, 30, 1.0)
  field = lat[:, None] * 1000 + lon[None]
  box = xr.Dataset({"2m_temperature": (("time", "latitude", "longitude"), field[None])},
                   coords={"latitude": lat, "longitude": lon})
  truth = datasets.on_forecast_points(inside, box, "box.zarr", "truth")
  np.testing.assert_array_equal(
      truth["2m_temperature"].values[0],
      points.latitude[points.region] * 1000 + points.longitude[points.region])
  # A box: the points inside it, weighed by their cells (the Voronoi cells without
  # cell_area); a truth lacking a point is one error.
  inside, weights = datasets.restricted(forecast, "45,55,5,20")
  kept = region_lib.in_box(points.latitude, points.longitude, (45, 55, 5, 20))
  np.testing.assert_array_equal(inside.dataset["2m_temperature"].values[0], values[kept])
  bare = datasets.Forecast("f.zarr", on_points.drop_vars("cell_area"), forecast.variables)
  np.testing.assert_allclose(datasets.restricted(bare, "45,55,5,20")[1].values,
                             points.area[kept], rtol=1e-9)
  wider, _ = datasets.restricted(forecast, "35,55,5,20")  # global points south of 40 N
  with pytest.raises(UserError, match=r"The truth box.zarr has no point at latitude 36.5625, "
                     r"longitude 5.625 of the forecast f.zarr \(3 of its 228 points"):
    datasets.on_forecast_points(wider, box, "box.zarr", "truth")
  with pytest.raises(UserError, match="region=cutout: the forecast f.zarr has no 'region'"):
    datasets.restricted(datasets.Forecast("f.zarr", on_points.drop_vars("region"),
                                          forecast.variables), datasets.CUTOUT)
  # A regular forecast: the box's rows and columns, their latitude weights.
  regular = xr.Dataset({"2m_temperature": (("time", "latitude", "longitude"), field[None])},
                       coords={"latitude": lat, "longitude": lon}).isel(
                           latitude=slice(None, None, -1))
  inside, weights = datasets.restricted(
      datasets.Forecast("r.zarr", regular, forecast.variables), "50,55,10,12")
  assert inside.dataset.sizes == {"time": 1, "latitude": 5, "longitude": 2}
  np.testing.assert_array_equal(weights.latitude.values, np.arange(50.5, 55, 1.0))
  np.testing.assert_array_equal(
      datasets.on_forecast_points(inside, box, "box.zarr", "truth")["2m_temperature"].values,
      inside.dataset["2m_temperature"].values)


@pytest.fixture(scope="module")
def cutout_run(tmp_path_factory):
  """The tiny run with a 1 deg box (40-60 N, 0-30 E) cut into its 5.625 deg store, 4
  steps on one device, the region weighed 4 times and its mesh refined twice more; then a
  forecast of one initial time and its region's scores against the regional store.
  `(workdir, regional store, forecast, evaluation dir, the run's stderr)`."""
  root = tmp_path_factory.mktemp("cutout_run")
  regional = synthetic.write_synthetic_store(
      str(root / "box.zarr"), resolution=1.0, region=BOX, start="2020-01-01",
      end="2020-01-31", levels=[500, 850], variables=list(
          config_lib.default_config().data.variables))
  workdir, forecast, out = (str(root / name) for name in ("run", "forecast.zarr", "eval"))
  result = run(workdir, devices=1, graph=1, extra=[
      f"--config.data.regional_path={regional}", "--config.data.regional_loss_weight=4",
      "--config.model.regional_mesh_levels=2",
      "--config.train.steps=4", "--config.train.eval_every=0",
      "--config.train.checkpoint_every=4"])
  launch("forecast", f"--workdir={workdir}", f"--out={forecast}",
         "--init_times=2020-01-21T06", "--lead=6h")
  launch("evaluate", f"--forecast={forecast}", f"--truth={regional}", "--region=cutout",
         f"--out={out}")
  return workdir, regional, forecast, out, result.stderr


@pytest.mark.slow
def test_a_cut_out_trains_forecasts_and_scores_its_region(cutout_run):
  workdir, regional, forecast_path, out, stderr = cutout_run
  assert "grid cut-out: 600 regional points in regular 5.625 deg (32 x 64) (2,628 points)" \
      in stderr
  assert f"--truth={regional} --region=cutout" in stderr
  mesh_nodes = int(re.search(r"'mesh_nodes': (\d+)", stderr).group(1))
  assert mesh_nodes > 162  # the tiny mesh's 162 and the region's
  loss = [value for _, value in sorted(losses(workdir).items())]
  assert len(loss) == 4 and np.all(np.isfinite(loss))
  # The forecast is on the joined points, with the region's mask and the model's areas.
  forecast = xr.open_zarr(forecast_path, chunks=None).load()
  truth = xr.open_zarr(regional, chunks=None)
  assert forecast.sizes["values"] == 2628 and forecast["region"].values.sum() == 600
  with open(os.path.join(workdir, "config.json")) as f:
    data = json.load(f)["data"]
  points = store_formats.open_store(data["path"], ["2m_temperature"], [],
                                    regional_path=regional).points
  np.testing.assert_allclose(forecast["cell_area"].values, points.area)
  # The region's RMSE against the regional store, weighed by the model's areas.
  region = forecast["region"].values
  predicted = forecast["2m_temperature"].values[0, 0, region].astype(np.float64)
  # The store's latitude descends; the region's points ascend, latitude-major.
  observed = truth["2m_temperature"].sel(time="2020-01-21T12").transpose(
      "latitude", "longitude").values[::-1].reshape(-1)
  np.testing.assert_allclose(forecast.latitude.values[region],
                             np.sort(truth.latitude.values).repeat(30))
  area = points.area[region]
  rmse = np.sqrt(np.sum(area * (predicted - observed) ** 2) / area.sum())
  results = xr.open_dataset(os.path.join(out, "forecast.nc"))
  np.testing.assert_allclose(results["2m_temperature"].sel(metric="rmse").values[0], rmse,
                             rtol=1e-9)
  with open(os.path.join(out, "metrics.json")) as f:
    assert json.load(f)["region"] == "cutout"
  # A box that is no box is an error of the `region` argument (launch.evaluate's --region).
  with pytest.raises(ArgumentError, match="region=40,60: not a box lat0,lat1,lon0,lon1"
                     ) as raised:
    scoring.evaluate(forecast_path, regional, f"{out}-bad", region="40,60")
  assert raised.value.argument == "region" and not os.path.exists(f"{out}-bad")
