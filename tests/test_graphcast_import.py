"""GraphCast's checkpoints run in wnscale and predict what GraphCast predicts.

The fixture (tests/fixtures/graphcast_5p625/README.md) is a small GraphCast model
made with the reference implementation: its checkpoint in the published file
format, its statistics, an example in the published example format, and the
reference's own predictions for it. Here: the checkpoint is imported into a
wnscale run directory, the example predicted through `launch.predict_example`'s
library function, and every variable compared with the reference's predictions
at every grid point except the mesh-to-grid ties (grid points on a mesh edge,
where the reference's choice between two faces is float rounding; see
tests/test_reference_graphs.py).
"""

import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr

from wnscale import specs as specs_lib
from wnscale.graphs.points import PointSet
from wnscale.interop import graphcast_checkpoint, graphcast_config, graphcast_example
from wnscale.interop.graphcast_import import import_graphcast
from wnscale.model import setup

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "graphcast_5p625")
CHECKPOINT = os.path.join(FIXTURE, "params.npz")
STATS = os.path.join(FIXTURE, "stats")
EXAMPLE = os.path.join(FIXTURE, "example.nc")
REPO = os.path.join(os.path.dirname(__file__), "..")
FACTOR = 0.6180338738074472  # the fixture's mesh2grid_edge_normalization_factor
TOLERANCE = 1e-3  # of each variable's diffs_stddev_by_level


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("imported") / "run")
  return out, import_graphcast(CHECKPOINT, STATS, out)


def off_tie_errors(predictions: xr.Dataset) -> dict[str, float]:
  """`{variable: max |prediction - reference| / diffs_stddev}` outside the tie grid points."""
  reference = xr.load_dataset(os.path.join(FIXTURE, "predictions.nc"))
  diffs_std = xr.load_dataset(os.path.join(STATS, "diffs_stddev_by_level.nc"))
  with np.load(os.path.join(FIXTURE, "graphs.npz")) as graphs:
    ties = graphs["tie_grid_indices"]
  keep = np.ones(reference.sizes["lat"] * reference.sizes["lon"], bool)
  keep[ties] = False
  assert sorted(predictions.data_vars) == sorted(reference.data_vars)
  errors = {}
  for name in reference.data_vars:
    assert predictions[name].dims == reference[name].dims, name
    scale = diffs_std[name]
    if "level" in scale.dims:
      scale = scale.sel(level=reference["level"].values)
    error = np.abs(predictions[name] - reference[name]) / scale.astype(np.float32)
    flat = error.values.reshape(error.shape[:-2] + (-1,))
    errors[name] = float(flat[..., keep].max())
  return errors


def test_checkpoint_file_is_read(imported):
  checkpoint = graphcast_checkpoint.read_checkpoint(CHECKPOINT)
  assert checkpoint.model_config == {
      "resolution": 5.625, "mesh_size": 2, "latent_size": 32, "gnn_msg_steps": 4,
      "hidden_layers": 1, "radius_query_fraction_edge_length": 0.6,
      "mesh2grid_edge_normalization_factor": FACTOR}
  task = checkpoint.task_config
  assert task["pressure_levels"] == (500, 850) and task["input_duration"] == "12h"
  assert task["forcing_variables"] == ("toa_incident_solar_radiation", "year_progress_sin",
                                       "year_progress_cos", "day_progress_sin",
                                       "day_progress_cos")
  assert len(task["input_variables"]) == 16 and len(task["target_variables"]) == 9
  assert sum(len(leaves) for leaves in checkpoint.params.values()) == 118
  assert checkpoint.params["mesh_gnn/~_networks_builder/encoder_edges_mesh_mlp/~/linear_0"][
      "w"].shape == (4, 32)
  assert checkpoint.license.startswith("Random parameters")


def test_config_from_model_and_task(imported):
  out, config = imported
  m, d = config.model, config.data
  assert (m.latent_size, m.mesh_levels, m.message_passing_steps) == (32, 2, 4)
  assert m.radius_fraction == 0.6 and m.mesh_to_grid_edge_normalization == FACTOR
  assert d.variables == ("temperature", "geopotential", "u_component_of_wind",
                         "v_component_of_wind", "specific_humidity", "2m_temperature",
                         "mean_sea_level_pressure", "10m_u_component_of_wind",
                         "10m_v_component_of_wind")
  assert d.target_only_variables == () and d.pressure_levels == (500, 850)
  assert d.forcings[0] == "toa_incident_solar_radiation" and len(d.forcings) == 5
  assert d.stored_forcings == ("toa_incident_solar_radiation",)
  assert d.input_normalization == "all" and d.input_steps == 2
  assert d.stats_path == os.path.join(out, "stats")
  assert sorted(os.listdir(d.stats_path)) == sorted(os.listdir(STATS))
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["data"]["stored_forcings"] == ["toa_incident_solar_radiation"]
  # The reference's 45 input channels are wnscale's, permuted by name.
  task = graphcast_checkpoint.read_checkpoint(CHECKPOINT).task_config
  ours = graphcast_config.wnscale_input_channels(specs_lib.from_config(config).data)
  theirs = graphcast_config.reference_input_channels(task)
  assert len(ours) == len(theirs) == 45 and set(ours) == set(theirs)
  assert theirs[14] == ("geopotential_at_surface", None, None)
  assert theirs[40:] == [(name, 1, None) for name in (
      "day_progress_cos", "day_progress_sin", "toa_incident_solar_radiation",
      "year_progress_cos", "year_progress_sin")]


def test_imported_config_file(imported):
  """configs/imported.py:RUN (the config of `launch.train --config=...`) is the run's."""
  out, config = imported
  spec = importlib.util.spec_from_file_location(
      "imported_config", os.path.join(REPO, "configs", "imported.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  assert module.get_config(out).to_dict() == config.to_dict()
  with pytest.raises(ValueError, match="No config.json in /nonexistent"):
    module.get_config("/nonexistent")


def test_a_netcdf4_copy_imports_and_predicts_alike(imported, tmp_path):
  """The fixture's example and statistics re-saved as netCDF4 (HDF5, what the CDS delivers and
  xarray writes where h5netcdf is installed): the same import and the same predictions."""
  out, config = imported
  netcdf4 = os.path.join(FIXTURE, "netcdf4")
  assert open(os.path.join(netcdf4, "example.nc"), "rb").read(4) == b"\x89HDF"
  out4 = str(tmp_path / "run4")
  config4 = import_graphcast(CHECKPOINT, os.path.join(netcdf4, "stats"), out4)
  assert config4.model.to_dict() == config.model.to_dict()
  predictions = [graphcast_example.predict_example(run, example, str(tmp_path / f"{i}.nc"))
                 for i, (run, example) in enumerate(
                     [(out, EXAMPLE), (out4, os.path.join(netcdf4, "example.nc"))])]
  xr.testing.assert_identical(*predictions)
  errors = off_tie_errors(predictions[1])
  assert max(errors.values()) < TOLERANCE, errors


def test_predictions_match_the_reference(imported, tmp_path):
  out, _ = imported
  path = str(tmp_path / "predictions.nc")
  predictions = graphcast_example.predict_example(out, EXAMPLE, path)
  # The reference's format: sorted names, (time, batch, [level,] lat, lon), lead times.
  assert list(predictions.data_vars) == sorted(predictions.data_vars)
  assert predictions["temperature"].dims == ("time", "batch", "level", "lat", "lon")
  np.testing.assert_array_equal(predictions["time"].values, [np.timedelta64(6, "h")])
  errors = off_tie_errors(xr.load_dataset(path))
  assert max(errors.values()) < TOLERANCE, errors


def test_latitude_descending_example(imported, tmp_path):
  """The same example with latitude north to south: the same predictions, in that order."""
  out, _ = imported
  flipped = str(tmp_path / "flipped.nc")
  xr.load_dataset(EXAMPLE).isel(lat=slice(None, None, -1)).to_netcdf(flipped)
  predictions = graphcast_example.predict_example(out, flipped, str(tmp_path / "p.nc"))
  assert predictions["lat"].values[0] > predictions["lat"].values[-1]
  errors = off_tie_errors(predictions.isel(lat=slice(None, None, -1)))
  assert max(errors.values()) < TOLERANCE, errors


def test_mesh_to_grid_normalization_none(tmp_path):
  """A checkpoint whose factor is None (not stored): the import sets 0, and the mesh-to-grid
  edge features are divided by the longest mesh-to-grid edge."""
  variant = str(tmp_path / "none.npz")
  with np.load(CHECKPOINT) as npz:
    np.savez(variant, **{key: npz[key] for key in npz.files
                         if key != "model_config:mesh2grid_edge_normalization_factor"})
  config = import_graphcast(variant, STATS, str(tmp_path / "run"))
  assert config.model.mesh_to_grid_edge_normalization == 0.0
  example = xr.load_dataset(EXAMPLE)
  latitude, longitude = example["lat"].values, example["lon"].values
  edges = setup.graphs_for_grid(specs_lib.from_config(config).model,
                                PointSet.regular(latitude, longitude)).edges["mesh_to_grid"]
  assert edges.features[:, 0].max() == 1.0
  # Against the fixture's edges (the factor's), rescaled: same features outside the ties.
  with np.load(os.path.join(FIXTURE, "graphs.npz")) as graphs:
    reference = graphs["mesh2grid_edge_features"]
    ties = np.repeat(np.isin(np.arange(len(latitude) * len(longitude)),
                             graphs["tie_grid_indices"]), 3)
  longest = FACTOR * reference[~ties, 0].max()  # the longest edge is not at a tie here
  # The graphs agree with the reference's to 1e-6 (test_reference_graphs); rescaling
  # multiplies that by FACTOR / longest (~1.95).
  np.testing.assert_allclose(edges.features[~ties], reference[~ties] * FACTOR / longest,
                             rtol=0, atol=1e-6 * FACTOR / longest)


@pytest.mark.parametrize("edit, message", [
    (lambda f: f.update({"model_config:hidden_layers": np.array(2)}), "hidden_layers=2"),
    (lambda f: f.update({"task_config:input_variables:0": np.array("snow_depth")}),
     "does not know: \\['snow_depth'\\]"),
    (lambda f: f.pop("task_config:input_variables:15"), "lacks the statics \\['land_sea"),
    (lambda f: f.pop("params:mesh_gnn/~_networks_builder/processor_edges_3_mesh_mlp/~/linear_1"
                     ":w"), "no parameter .*processor_edges_3_mesh_mlp/~/linear_1:w"),
])
def test_bad_checkpoints_are_named(tmp_path, edit, message):
  with np.load(CHECKPOINT) as npz:
    flat = {key: npz[key] for key in npz.files}
  edit(flat)
  variant = str(tmp_path / "bad.npz")
  np.savez(variant, **flat)
  out = tmp_path / "run"
  with pytest.raises(ValueError, match=message):
    import_graphcast(variant, STATS, str(out))
  assert not out.exists()  # nothing written


def test_import_refuses_an_existing_run(imported):
  out, _ = imported
  with pytest.raises(ValueError, match="^out=.*: exists \\(a run directory\\); pass "
                     "`overwrite=True`") as library:
    import_graphcast(CHECKPOINT, STATS, out)
  assert "--" not in str(library.value)


def test_example_errors_are_named(imported, tmp_path):
  out, _ = imported
  with pytest.raises(ValueError, match="1 target time.*toa_incident_solar_radiation"):
    graphcast_example.predict_example(out, EXAMPLE, str(tmp_path / "p.nc"), steps=2)
  no_tisr = str(tmp_path / "no_tisr.nc")
  xr.load_dataset(EXAMPLE).drop_vars("toa_incident_solar_radiation").to_netcdf(no_tisr)
  with pytest.raises(ValueError, match="lacks \\['toa_incident_solar_radiation'\\]"):
    graphcast_example.predict_example(out, no_tisr, str(tmp_path / "p.nc"))
  assert not (tmp_path / "p.nc").exists()


_OWN_MODULES = {os.path.basename(path) for path in
                 glob.glob(os.path.join(REPO, "wnscale", "**", "*.py"), recursive=True)
                 + glob.glob(os.path.join(REPO, "launch", "*.py"))}


@pytest.mark.slow
def test_launchers(tmp_path):
  """`launch.import_graphcast` then `launch.predict_example`, as a user runs them: no Orbax
  INFO lines in their logs (one save, one restore: dozens of lines without the filter)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  run = str(tmp_path / "run")
  out = str(tmp_path / "predictions.nc")
  for command in (["launch.import_graphcast", f"--checkpoint={CHECKPOINT}",
                   f"--stats_dir={STATS}", f"--out={run}"],
                  ["launch.predict_example", f"--workdir={run}", f"--example={EXAMPLE}",
                   f"--out={out}", "--steps=1"]):
    result = subprocess.run([sys.executable, "-m"] + command, cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    sources = set(re.findall(r"^[IWE]\d{4} [\d:.]+ +\d+ (\S+?\.py):\d+\]", result.stderr,
                             re.M))
    assert sources and sources <= _OWN_MODULES, sources - _OWN_MODULES
  errors = off_tie_errors(xr.load_dataset(out))
  assert max(errors.values()) < TOLERANCE, errors
  shutil.rmtree(run)
