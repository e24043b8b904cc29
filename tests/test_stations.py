"""Observations at stations: the store, its reader beside the grid, make_dataset --stations,
and a station run killed with SIGKILL resuming exactly (configs/tiny_stations.py).

(The model with stations, its loss and gradients under remat and sharding:
test_modalities.py.)"""


import numpy as np
import pytest

from wnscale import paths
from wnscale import specs as specs_lib
from wnscale.data import pipeline, run_data
from wnscale.data.making import stations, synthetic
from wnscale.data.reading import observations, store_formats
from wnscale.errors import ArgumentError, UserError

from problems import data_spec
from test_cli import assert_user_error, run
from tiny_runs import STATION_STEPS, losses, read_metrics

T2M, MSL = "2m_temperature", "mean_sea_level_pressure"


@pytest.fixture(scope="module")
def grid_store(tmp_path_factory) -> str:
  """A synthetic 5.625 deg store of 3 days at 6 h (12 times), its surface variables only."""
  return synthetic.write_synthetic_store(
      str(tmp_path_factory.mktemp("grid") / "grid.zarr"), start="2020-01-01",
      end="2020-01-03", levels=(500,), variables=[T2M, MSL])


def test_the_store_is_read_in_station_order_at_the_grid_times(grid_store, tmp_path):
  """Stations written in any order are read in station_id order; the times are aligned with
  the grid's: a grid time the observations lack (and one past them) is all-missing, an
  observation time off the grid is never read, a station absent for a while is NaN there.
  The statistics are the training times' (NaN skipped), cached; the source's examples hold
  the inputs at the input times and the targets at the target time, in the layout's point
  order with padding missing."""
  grid_times = store_formats.open_store(grid_store, [T2M, MSL], ()).times
  assert len(grid_times) == 12
  ids = np.array(["C", "A", "E", "B", "D"])
  rng = np.random.default_rng(0)
  kept = [0, 1, 2, 4, 5, 6, 7, 8, 9]  # grid time 3 and 10, 11 missing
  times = np.concatenate([grid_times[kept], grid_times[:1] + np.timedelta64(1, "h")])
  values = {name: rng.normal(size=(len(times), 5)).astype(np.float32) + offset
            for name, offset in ((T2M, 280.0), (MSL, 1e5))}
  values[T2M][5:9, 3] = np.nan  # station "B" absent at grid times 6..9
  order = rng.permutation(len(times))  # written in no time order either
  path = stations.write_observations(
      str(tmp_path / "obs.zarr"), times[order], ids, np.linspace(-60, 60, 5),
      np.linspace(0, 300, 5), {name: array[order] for name, array in values.items()})
  with pytest.raises(UserError, match=r"has no \['10m_u_component_of_wind'\]"):
    observations.open_observations(path, ["10m_u_component_of_wind"])
  store = observations.open_observations(path, [T2M, MSL])
  np.testing.assert_array_equal(store.station_id, ["A", "B", "C", "D", "E"])
  by_id = np.argsort(ids)
  np.testing.assert_array_equal(store.points.latitude, np.linspace(-60, 60, 5)[by_id])

  training = grid_times[:6]  # of which the store has 5 (grid time 3 missing)
  blob = observations.load_or_compute_stats(store, [T2M, MSL], training)
  assert paths.exists(observations.cached_stats_path(path, [T2M, MSL], training))
  stats = observations.stats_from_bytes(blob, [T2M, MSL])
  expected = values[T2M][[0, 1, 2, 3, 4]]
  np.testing.assert_allclose(stats["mean"][0], np.nanmean(expected), rtol=1e-6)
  np.testing.assert_allclose(stats["std"][0], np.nanstd(expected), rtol=1e-4)
  assert observations.load_or_compute_stats(store, [T2M, MSL], training) == blob

  modality = specs_lib.ModalitySpec("stations", path, (T2M,), (MSL, T2M))
  reader = observations.ModalityReader(modality, store, grid_times, stats)
  got = reader.read("targets", np.arange(12))  # [12, 2, 5]
  assert np.isnan(got[[3, 10, 11]]).all() and not np.isnan(got[[0, 1, 2, 4, 5]]).any()
  obs_row = {grid: row for row, grid in enumerate(kept)}
  for grid in kept:
    np.testing.assert_allclose(
        got[grid, 1] * stats["std"][0] + stats["mean"][0],
        values[T2M][obs_row[grid]][by_id], rtol=1e-6)
    np.testing.assert_allclose(got[grid, 0] * stats["std"][1] + stats["mean"][1],
                               values[MSL][obs_row[grid]][by_id], rtol=1e-6)
  assert np.isnan(got[6:10, 1, 1]).all()  # station "B"

  source = pipeline.make_source(data_spec(path=grid_store, variables=(T2M, MSL),
                                          pressure_levels=(), train_start="", train_end=""),
                                "train")
  slots = np.array([4, -1, 0, 1, 2, 3])
  source = source.with_modalities([reader]).in_layout(None, {"stations": slots})
  batch = source.read_batch([2, 0])
  assert batch["stations/inputs"].shape == (2, 2, 1, 6)
  assert batch["stations/targets"].shape == (2, 1, 2, 6)
  laid_out = reader.in_layout(slots)
  np.testing.assert_array_equal(batch["stations/inputs"][0], laid_out.read("inputs", [2, 3]))
  np.testing.assert_array_equal(batch["stations/targets"][1], laid_out.read("targets", [2]))
  assert np.isnan(batch["stations/inputs"][..., 1]).all()  # padding
  np.testing.assert_array_equal(batch["stations/targets"][1, 0, :, 2], got[2, :, 0])


def test_repeated_stations_and_a_source_without_a_store_are_refused(tmp_path):
  path = stations.write_observations(
      str(tmp_path / "obs.zarr"), np.array(["2020-01-01"], "datetime64[ns]"), ["A", "A"],
      [0.0, 10.0], [0.0, 10.0], {T2M: np.zeros((1, 2))})
  with pytest.raises(UserError, match=r"station_id \['A'\] repeat"):
    observations.open_observations(path, [T2M])
  missing = str(tmp_path / "none.zarr")
  data = data_spec(modalities=(("obs", missing, (T2M,), ()),))
  with pytest.raises(ArgumentError, match=f"data.modalities={missing}: no observation store "
                     "there \\(modality 'obs'\\)"):
    run_data.resolve_observations(data, data.modalities[0], seed=0)


def test_make_dataset_writes_a_station_network_of_a_grid_store(grid_store, tmp_path):
  """N land-biased stations observing the grid's surface variables at its times: the
  interpolated fields plus noise, the fraction asked for missing; an existing store is kept
  without --overwrite, and a grid flag beside --stations is refused."""
  out = str(tmp_path / "obs.zarr")
  args = ["--stations=300", f"--from_store={grid_store}", f"--out={out}",
          "--station_missing=0.25", "--seed=4"]
  result = run("make_dataset", *args)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"wrote {out} (300 stations" in result.stdout
  store = observations.open_observations(out, [T2M, MSL])
  grid = store_formats.open_store(grid_store, [T2M, MSL], ())
  np.testing.assert_array_equal(store.times, grid.times)
  for name, channel in ((T2M, 0), (MSL, 1)):
    observed = store.values[name]
    assert 0.2 < np.isnan(observed).mean() < 0.3
    truth = stations.interpolate(grid.read_state(np.arange(len(grid.times)))[:, channel],
                                 grid.points, store.points)
    noise = np.nanstd(observed - truth)
    assert 0.05 < noise / np.std(truth) < 0.15  # 10% of the std
  land = grid.read_statics()[1] > 0.5
  nearest = np.argmin(np.linalg.norm(store.points.xyz()[:, None] - grid.points.xyz()[None],
                                     axis=-1), axis=1)
  assert 0.7 < land[nearest].mean() < 0.9  # 80% on land

  assert_user_error(run("make_dataset", *args), f"--out={out}: exists", "--overwrite")
  assert_user_error(run("make_dataset", *args[:2], f"--out={tmp_path / 'other.zarr'}",
                        "--resolution=1"), "--resolution", "takes its grid and times from "
                    "--from_store")


@pytest.mark.slow
def test_a_station_run_killed_resumes_exactly_and_scores_the_stations(trained_station_run):
  """configs/tiny_stations.py on 2 graph shards: its first run writes the grid and station
  stores; killed (SIGKILL) after step 8, in the evaluation there, with its checkpoint of
  step 6 whole, it resumes at step 6 and logs the losses of steps 7 and 8 that it logged
  before, bitwise (the data iterator, parameters and optimizer state restored); its
  evaluation lines score each station variable beside the grid's."""
  workdir, before = trained_station_run.workdir, trained_station_run.before
  assert "Writing a synthetic network of 500 stations" in trained_station_run.first_stderr
  assert "stations: 500 stations from" in trained_station_run.first_stderr
  assert 8 <= max(before) < STATION_STEPS
  assert "Resumed from step 6" in trained_station_run.resumed_stderr
  # The stores are kept.
  assert "Writing a synthetic network" not in trained_station_run.resumed_stderr
  after = losses(workdir)
  assert sorted(after) == list(range(1, STATION_STEPS + 1))
  assert {step: after[step] for step in before} == before  # exact, step for step
  evals = [m for m in read_metrics(workdir) if any(k.startswith("eval/") for k in m)]
  assert [m["step"] for m in evals] == [8]
  for name in (T2M, MSL):
    score = evals[0][f"eval/rmse/stations/{name}"]
    assert np.isfinite(score) and score > 0
    assert f"eval/rmse/{name}" in evals[0]  # the grid's beside them
