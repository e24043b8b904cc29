"""`launch.export_weathernext2`: a run back in WeatherNext 2's released format.

An import of the tiny fixture (`fixtures/weathernext2_tiny`) exported again gives back
every array of its checkpoint bitwise, in order, and its config; a fine-tuned run's export
(`weathernext2_runs.fine_tuned`) is what `fixtures/weathernext2_export` was made of with
WeatherNext 2's own code, whose predictions equal wnscale's (the measure of
`test_weathernext2.py`); a run WN2 cannot express is one line naming the setting.
"""

import copy
import json
import os

import numpy as np
import pytest
import xarray as xr

import weathernext2_runs
from test_cli import assert_user_error, run as run_launcher
from test_weathernext2 import PATH, TOLERANCE, errors, tied_nodes
from wnscale import specs as specs_lib
from wnscale.interop import fiddle_json, weathernext2_config
from wnscale.interop.graphcast_example import predict_example
from wnscale.train.run_directory import RunDirectory

FIXTURE = weathernext2_runs.EXPORT_FIXTURE


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """`(imported, fine_tuned)` run directories (`weathernext2_runs`)."""
  root = tmp_path_factory.mktemp("weathernext2_export")
  imported, fine_tuned = str(root / "imported"), str(root / "fine_tuned")
  weathernext2_runs.import_fixture(imported)
  weathernext2_runs.fine_tuned(imported, fine_tuned)
  return imported, fine_tuned


def export(workdir, out, *flags):
  result = run_launcher("export_weathernext2", f"--workdir={workdir}", f"--out={out}", *flags)
  assert result.returncode == 0, result.stderr[-3000:]
  return out


def same_tree(a, b, path="") -> list[str]:
  """Where two configs (as `fiddle_json.load` gives them) differ: [] when they are equal."""
  if isinstance(a, xr.Dataset) or isinstance(b, xr.Dataset):
    return [] if isinstance(b, xr.Dataset) and a.identical(b) else [path]
  if isinstance(a, fiddle_json.Buildable):
    if not isinstance(b, fiddle_json.Buildable) or (a.kind, a.fn) != (b.kind, b.fn):
      return [path]
    return same_tree(a.arguments, b.arguments, path)
  if isinstance(a, dict):
    if list(a) != list(b):
      return [f"{path}: keys"]
    return [where for key in a for where in same_tree(a[key], b[key], f"{path}.{key}")]
  if isinstance(a, (list, tuple)):
    if type(a) is not type(b) or len(a) != len(b):
      return [path]
    return [where for i, (x, y) in enumerate(zip(a, b))
            for where in same_tree(x, y, f"{path}[{i}]")]
  return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_an_import_exported_gives_back_every_array_bitwise_and_its_config(runs, tmp_path):
  imported, _ = runs
  out = export(imported, str(tmp_path / "export"))
  assert sorted(os.listdir(out)) == ["config.json", "params.npz"]
  with np.load(PATH["params.npz"]) as original, np.load(os.path.join(out,
                                                                      "params.npz")) as ours:
    assert ours.files == original.files  # every array, in the same order
    for key in original.files:
      assert ours[key].dtype == original[key].dtype and ours[key].shape == original[
          key].shape, key
      assert np.array_equal(ours[key], original[key]), key
  assert same_tree(fiddle_json.load(os.path.join(out, "config.json")),
                   fiddle_json.load(PATH["config.json"])) == []


def test_weathernext2s_own_code_predicts_from_an_export_what_wnscale_predicts(runs, tmp_path):
  """The fixture's predictions were made by WN2's code from this export (its digest): at
  every grid node with one mesh-to-grid triangle, both members, within `TOLERANCE`."""
  _, fine_tuned = runs
  out = export(fine_tuned, str(tmp_path / "export"))
  with open(os.path.join(FIXTURE, "export.json")) as f:
    assert weathernext2_runs.digest(out) == json.load(f)
  config = fiddle_json.load(os.path.join(out, "config.json"))
  weights = config.arguments["predictor_kwargs"]["fgn_loss_function_kwargs"][
      "per_variable_weights"]
  assert (weights["geopotential"], weights["2m_temperature"]) == (0.25, 0.5)  # the run's
  example = str(tmp_path / "example.nc")
  xr.load_dataset(PATH["example.nc"]).isel(time=[0, 1, 2]).to_netcdf(example)
  ours = predict_example(fine_tuned, example, str(tmp_path / "ours.nc"), members=2,
                         noise=PATH["noise.npz"])
  theirs = xr.open_dataset(os.path.join(FIXTURE, "predictions.nc"))
  tied = tied_nodes()
  for name, error in errors(ours, theirs).items():
    assert bool((np.isnan(ours[name]) == np.isnan(
        theirs[name].transpose(*ours[name].dims))).all()), name
    assert float(error.where(~tied).max()) < TOLERANCE, name
    assert float(error.max()) > 0  # computed, not copied: the two codes round apart


def test_an_export_imports_back_to_the_same_run(runs, tmp_path):
  """Export, import the export: the same config (model and data) and parameters."""
  _, fine_tuned = runs
  out = export(fine_tuned, str(tmp_path / "export"))
  again = str(tmp_path / "again")
  result = run_launcher("import_weathernext2", f"--checkpoint={out}/params.npz",
                        f"--config={out}/config.json", f"--out={again}")
  assert result.returncode == 0, result.stderr[-3000:]
  ours, back = RunDirectory(fine_tuned).read_config(), RunDirectory(again).read_config()
  for section in ("model", "data"):
    for key in ours[section]:
      if key not in ("stats_path",):
        assert back[section][key] == ours[section][key], (section, key)
  exported_again = export(again, str(tmp_path / "export_again"))
  with np.load(f"{out}/params.npz") as a, np.load(f"{exported_again}/params.npz") as b:
    assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files
                                       if k != "description")


@pytest.mark.parametrize("change, setting", [
    (lambda c: c.model.update(processor="interaction_network"),
     "this run's model.processor='interaction_network': WeatherNext 2's is 'transformer'"),
    (lambda c: c.model.update(output_activations=("cyclone_exists_gaussian_unit_mode:relu:0",)),
     "this run's model.output_activations cyclone_exists_gaussian_unit_mode:relu: its "
     "activations are "
     "('sigmoid',)"),
    (lambda c: c.model.update(mesh_to_grid_edge_normalization=0.6),
     "this run's model.mesh_to_grid_edge_normalization=0.6: its config maps to 0.0 there"),
    (lambda c: c.data.update(input_normalization="state"),
     "this run's data.input_normalization='state': WeatherNext 2's is 'all'"),
])
def test_a_run_weathernext2_cannot_express_is_one_line_and_nothing_written(
    runs, tmp_path, change, setting):
  imported, _ = runs
  config = copy.deepcopy(RunDirectory(imported).read_config())
  change(config)
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(config.to_json_best_effort())
  result = run_launcher("export_weathernext2", f"--workdir={workdir}",
                        f"--out={tmp_path / 'out'}")
  line = assert_user_error(result, "error: WeatherNext 2's model cannot express " + setting)
  assert "--workdir" not in line
  assert not os.path.exists(tmp_path / "out")


def test_an_existing_output_is_replaced_only_when_asked(runs, tmp_path):
  imported, _ = runs
  out = export(imported, str(tmp_path / "export"))
  before = {name: open(os.path.join(out, name), "rb").read() for name in os.listdir(out)}
  result = run_launcher("export_weathernext2", f"--workdir={imported}", f"--out={out}")
  assert_user_error(result, f"--out={out}: exists", "pass --overwrite")
  assert {name: open(os.path.join(out, name), "rb").read() for name in os.listdir(out)} == (
      before)
  export(imported, out, "--overwrite")
  assert sorted(os.listdir(out)) == ["config.json", "params.npz"]


def test_a_run_trained_from_scratch_gets_weathernext2s_released_settings(runs, tmp_path):
  """Without an import to take them from, what wnscale does not express is as WN2
  released it (its TPU attention), the rest from the run; it maps back to the run."""
  imported, _ = runs
  config = copy.deepcopy(RunDirectory(imported).read_config())
  from wnscale.interop import weathernext2_predictor  # noqa: PLC0415
  from wnscale.interop.weathernext2_export import run_statistics  # noqa: PLC0415
  specs = specs_lib.from_config(config)
  built = weathernext2_predictor.predictor_config(config, specs, run_statistics(specs.data))
  transformer = built.arguments["predictor_kwargs"]["noisy_function_kwargs"][
      "mesh_model_ctor"].arguments["transformer_kwargs"]
  assert transformer["attention_type"] == "splash_mha" and transformer["d_model"] == 32
  path = tmp_path / "config.json"
  path.write_text(fiddle_json.dump(built))
  back = weathernext2_config.wnscale_config(fiddle_json.load(str(path)),
                                            config.data.stats_path)
  for section in ("model", "data"):
    assert back[section].to_dict() == config[section].to_dict(), section
