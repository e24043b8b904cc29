"""Export: a run made or fine-tuned here, written as GraphCast's checkpoint file.

The 5.625 deg fixture (tests/fixtures/graphcast_5p625/README.md) is imported,
exported back (bitwise the published file), fine-tuned and exported (read here
by a reader of GraphCast's format written in this file, not the project's
importer, and checked array by array against the fine-tuned parameters), and
runs GraphCast's model cannot express are refused before anything is read.
"""

import copy
import dataclasses
import os
import re
import shutil

import jax
import numpy as np
import pytest
import xarray as xr
from flax import nnx

from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.data.reading import normalization
from wnscale.errors import UserError
from wnscale.interop import graphcast_checkpoint
from wnscale.interop.graphcast_export import export_graphcast
from wnscale.interop.graphcast_import import REMAINDER, import_graphcast
from wnscale.model import setup
from wnscale.train import checkpoint
from wnscale.train.run_directory import RunDirectory
from graphcast_runs import FIXTURE
from test_cli import assert_user_error, run

CHECKPOINT = os.path.join(FIXTURE, "params.npz")
STATS = os.path.join(FIXTURE, "stats")
STATS_FILES = ("mean_by_level.nc", "stddev_by_level.nc", "diffs_stddev_by_level.nc")
ENCODER, PROCESSOR, DECODER = (f"{gnn}/~_networks_builder/" for gnn in
                               ("grid2mesh_gnn", "mesh_gnn", "mesh2grid_gnn"))
LATENT = 32


@pytest.fixture(scope="module")
def imported(graphcast_import):
  """The fixture's import (shared: read only)."""
  return graphcast_import.imported


def read_graphcast(path: str) -> dict:
  """GraphCast's `CheckPoint` file, read with numpy alone: `{"params": {module: {leaf:
  array}}, "model_config": {field: value}, "task_config": {field: value or tuple},
  "description": str, "license": str}`. Keys are `:`-joined paths; a tuple's items are
  numbered."""
  out = {"params": {}, "model_config": {}, "task_config": {}}
  items = {}
  with np.load(path, allow_pickle=False) as npz:
    for key in npz.files:
      value = npz[key]
      head, *rest = key.split(":")
      if head == "params":
        module, leaf = rest
        out["params"].setdefault(module, {})[leaf] = value
      elif head in ("model_config", "task_config") and len(rest) == 1:
        out[head][rest[0]] = value.item()
      elif head == "task_config":
        items.setdefault(rest[0], {})[int(rest[1])] = value.item()
      else:
        assert head in ("description", "license") and not rest, key
        out[head] = str(value)
  for field, numbered in items.items():
    out["task_config"][field] = tuple(numbered[i] for i in range(len(numbered)))
  return out


def test_round_trip_is_bitwise(imported, tmp_path):
  """import -> export: every array of the published file bitwise (same keys, same order),
  the same configs and texts, the statistics files byte for byte."""
  out, stats = str(tmp_path / "params.npz"), str(tmp_path / "stats")
  export_graphcast(imported, out, stats_dir=stats)
  with np.load(CHECKPOINT) as original, np.load(out) as exported:
    assert exported.files == original.files
    for key in original.files:
      a, b = original[key], exported[key]
      assert (a.dtype, a.shape) == (b.dtype, b.shape) and a.tobytes() == b.tobytes(), key
  for name in STATS_FILES:
    with open(os.path.join(STATS, name), "rb") as a, open(os.path.join(stats, name), "rb") as b:
      assert a.read() == b.read(), name
  # Outputs are not replaced unasked, and are when asked.
  with pytest.raises(UserError, match="exists"):
    export_graphcast(imported, out)
  export_graphcast(imported, out, overwrite=True)


def test_without_the_import_remainder_the_model_is_the_same(imported, tmp_path):
  """A run without the import's remainder (an older import): the parts wnscale's
  parameters do not hold are written as zeros, and importing that file gives back the
  same wnscale parameters (what the model computes)."""
  bare = str(tmp_path / "bare")
  shutil.copytree(imported, bare)
  os.remove(os.path.join(bare, REMAINDER))
  out = str(tmp_path / "params.npz")
  export_graphcast(bare, out)
  exported, original = read_graphcast(out)["params"], read_graphcast(CHECKPOINT)["params"]
  first = ENCODER + "encoder_nodes_mesh_nodes_mlp/~/linear_0"
  np.testing.assert_array_equal(exported[first]["w"][:45], 0)  # padded rows
  np.testing.assert_array_equal(exported[first]["w"][45:], original[first]["w"][45:])
  unused = DECODER + "processor_nodes_0_mesh_nodes_layer_norm"
  np.testing.assert_array_equal(exported[unused]["scale"], 1)
  reimported = str(tmp_path / "reimported")
  import_graphcast(out, STATS, reimported)
  a, b = (params_of(run_dir, "raw") for run_dir in (imported, reimported))
  for (path, x), (_, y) in zip(flat(a), flat(b)):
    np.testing.assert_array_equal(x, y, err_msg=path)


def test_the_imports_own_configs_are_written_back(imported, tmp_path):
  """An import's original configs, where they differ from the derived ones only in what
  wnscale does not keep (the order of the task's inputs, statics first here), are
  written back as they were; the parameters do not depend on that order."""
  run_dir = str(tmp_path / "run")
  shutil.copytree(imported, run_dir)
  remainder = graphcast_checkpoint.read_checkpoint(os.path.join(run_dir, REMAINDER))
  inputs = remainder.task_config["input_variables"]
  reordered = STATICS + tuple(name for name in inputs if name not in STATICS)
  assert reordered != inputs
  task = dict(remainder.task_config, input_variables=reordered)
  with open(os.path.join(run_dir, REMAINDER), "wb") as f:
    f.write(graphcast_checkpoint.to_bytes(dataclasses.replace(remainder, task_config=task)))
  out = str(tmp_path / "params.npz")
  export_graphcast(run_dir, out)
  exported, original = read_graphcast(out), read_graphcast(CHECKPOINT)
  assert exported["task_config"] == dict(original["task_config"], input_variables=reordered)
  for module, leaves in original["params"].items():
    for leaf, value in leaves.items():
      np.testing.assert_array_equal(exported["params"][module][leaf], value)


def test_statistics_of_wnscale_format_in_graphcast_layout(imported, tmp_path):
  """A run whose statistics are a wnscale file: `stats_dir` gets GraphCast's three files,
  each variable's mean, std and diff_std as the run normalizes with (those of the
  fixture's files here, which made the wnscale file), atmospheric ones over the levels."""
  stats_file = str(tmp_path / "stats.nc")
  with open(stats_file, "wb") as f:
    f.write(normalization.to_bytes(normalization.read_stats(STATS)))
  run_dir = str(tmp_path / "run")
  shutil.copytree(imported, run_dir)
  config = RunDirectory(run_dir).read_config()
  config.data.stats_path = stats_file
  RunDirectory(run_dir).write_config(config_lib.to_json(config), history=False)
  export_graphcast(run_dir, str(tmp_path / "params.npz"), stats_dir=str(tmp_path / "out"))
  used = STATE + FORCINGS + STATICS
  for name in STATS_FILES:
    written = xr.load_dataset(tmp_path / "out" / name)
    published = xr.load_dataset(os.path.join(STATS, name))
    assert written["level"].dtype == np.int32
    np.testing.assert_array_equal(written["level"], published["level"])
    for variable in used:
      if name.startswith("diffs") and variable in STATICS:
        continue  # statics do not change: wnscale keeps their std there
      assert written[variable].dims == published[variable].dims, variable
      np.testing.assert_array_equal(written[variable], published[variable], err_msg=variable)


def params_of(workdir: str, which: str):
  """The newest parameters (`which`: "ema" or "raw") of a run, as a pure dict of numpy."""
  config = RunDirectory(workdir).read_config()
  _, shapes = setup.init_model_shapes(specs_lib.from_config(config))
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  params, _ = checkpoint.restore_params(os.path.join(workdir, "checkpoints"),
                                        checkpoint.abstract_like(shapes, device), which=which)
  return jax.tree.map(np.asarray, nnx.to_pure_dict(params))


def flat(tree, prefix=""):
  if isinstance(tree, dict):
    return [item for key in sorted(tree) for item in flat(tree[key], f"{prefix}{key}.")]
  return [(prefix, tree)]


# The fixture's task (README): wnscale's input channels (`model.forecast`: the state at
# -6 h then 0 h, each variable by level, then the forcings at -6 h, 0 h, +6 h, then the
# statics) and GraphCast's (every input sorted by name, each time-major then by level,
# then the forcings at +6 h sorted by name). Outputs: wnscale's in the state's order,
# GraphCast's sorted by name; levels 500, 850.
STATE = ("temperature", "geopotential", "u_component_of_wind", "v_component_of_wind",
         "specific_humidity", "2m_temperature", "mean_sea_level_pressure",
         "10m_u_component_of_wind", "10m_v_component_of_wind")
ATMOSPHERIC = STATE[:5]
FORCINGS = ("toa_incident_solar_radiation", "year_progress_sin", "year_progress_cos",
            "day_progress_sin", "day_progress_cos")
STATICS = ("geopotential_at_surface", "land_sea_mask")


def levels(name):
  return (500, 850) if name in ATMOSPHERIC else (None,)


WNSCALE_INPUTS = ([(name, t, level) for t in (-1, 0) for name in STATE for level in levels(name)]
                  + [(name, t, None) for t in (-1, 0, 1) for name in FORCINGS]
                  + [(name, None, None) for name in STATICS])
GRAPHCAST_INPUTS = (
    [(name, None, None) if name in STATICS else (name, t, level)
     for name in sorted(STATE + FORCINGS + STATICS)
     for t in ((None,) if name in STATICS else (-1, 0)) for level in levels(name)]
    + [(name, 1, None) for name in sorted(FORCINGS)])
WNSCALE_OUTPUTS = [(name, level) for name in STATE for level in levels(name)]
GRAPHCAST_OUTPUTS = [(name, level) for name in sorted(STATE) for level in levels(name)]


def expected_graphcast(tree: dict, original: dict) -> dict:
  """GraphCast's `{module: {leaf: array}}` of wnscale's parameters `tree`, by hand; the
  parts wnscale does not hold (mesh embedder padding, decoder mesh MLP) from `original`."""
  assert GRAPHCAST_INPUTS[14] == ("geopotential_at_surface", None, None)  # README's order
  assert len(GRAPHCAST_INPUTS) == len(WNSCALE_INPUTS) == 45
  grid_rows = [GRAPHCAST_INPUTS.index(key) for key in WNSCALE_INPUTS] + [45, 46, 47]
  out_columns = [GRAPHCAST_OUTPUTS.index(key) for key in WNSCALE_OUTPUTS]
  expected = {}

  def mlp(part, params, layer_norm=True, first=None):
    w0 = params["hidden"]["kernel"] if first is None else first
    expected[f"{part}_mlp/~/linear_0"] = {"w": w0, "b": params["hidden"]["bias"]}
    expected[f"{part}_mlp/~/linear_1"] = {"w": params["out"]["kernel"],
                                          "b": params["out"]["bias"]}
    if layer_norm:
      expected[f"{part}_layer_norm"] = {"scale": params["norm"]["scale"],
                                        "offset": params["norm"]["bias"]}

  def interaction(edges, nodes, params):
    first = np.concatenate([params["edge_mlp"]["hidden"]["kernel"],
                            params["sender_projection"]["kernel"],
                            params["receiver_projection"]["kernel"]])
    mlp(edges, params["edge_mlp"], first=first)
    mlp(nodes, params["node_mlp"])

  grid = tree["grid_embedder"]
  grid_w0 = np.zeros((48, LATENT), np.float32)
  grid_w0[grid_rows] = grid["hidden"]["kernel"]
  mlp(ENCODER + "encoder_nodes_grid_nodes", grid, first=grid_w0)
  mesh = tree["mesh_embedder"]
  mesh_w0 = original[ENCODER + "encoder_nodes_mesh_nodes_mlp/~/linear_0"]["w"].copy()
  mesh_w0[45:] = mesh["hidden"]["kernel"]
  mlp(ENCODER + "encoder_nodes_mesh_nodes", mesh, first=mesh_w0)
  mlp(ENCODER + "encoder_edges_grid2mesh", tree["grid_to_mesh_edges"]["embedder"])
  interaction(ENCODER + "processor_edges_0_grid2mesh", ENCODER + "processor_nodes_0_mesh_nodes",
              tree["grid_to_mesh_edges"]["interaction"])
  mlp(ENCODER + "processor_nodes_0_grid_nodes", tree["grid_to_mesh_grid_mlp"])
  mlp(PROCESSOR + "encoder_edges_mesh", tree["processor"]["edge_embedder"])
  for i in range(4):
    layer = jax.tree.map(lambda x: x[i], tree["processor"]["layers"])  # noqa: B023
    interaction(f"{PROCESSOR}processor_edges_{i}_mesh",
                f"{PROCESSOR}processor_nodes_{i}_mesh_nodes", layer)
  mlp(DECODER + "encoder_edges_mesh2grid", tree["mesh_to_grid_edges"]["embedder"])
  interaction(DECODER + "processor_edges_0_mesh2grid", DECODER + "processor_nodes_0_grid_nodes",
              tree["mesh_to_grid_edges"]["interaction"])
  output = tree["output_mlp"]
  w1, b1 = np.zeros((LATENT, 14), np.float32), np.zeros(14, np.float32)
  w1[:, out_columns], b1[out_columns] = output["out"]["kernel"], output["out"]["bias"]
  mlp(DECODER + "decoder_nodes_grid_nodes",
      {"hidden": output["hidden"], "out": {"kernel": w1, "bias": b1}}, layer_norm=False)
  for module in ("mlp/~/linear_0", "mlp/~/linear_1", "layer_norm"):
    name = f"{DECODER}processor_nodes_0_mesh_nodes_{module}"
    expected[name] = original[name]
  return expected


@pytest.mark.slow
def test_a_fine_tuned_export_read_independently(fine_tuned_import, tmp_path):
  """Every array of the export: GraphCast's name and shape (the fixture's), and the value
  of the fine-tuned parameters (EMA by default, raw ones with params="raw") put in
  GraphCast's layout by `expected_graphcast`; trained ones moved from the fixture's."""
  fine_tuned = fine_tuned_import
  original = read_graphcast(CHECKPOINT)
  for which in ("ema", "raw"):
    out = str(tmp_path / f"{which}.npz")
    export_graphcast(fine_tuned, out, **({} if which == "ema" else {"params": "raw", "step": 2}))
    exported = read_graphcast(out)
    assert exported["model_config"] == original["model_config"]
    assert exported["task_config"] == original["task_config"]
    assert exported["license"] == original["license"]
    assert re.match(rf"Exported by wnscale from the run {re.escape(fine_tuned)}, step 2",
                    exported["description"]), exported["description"]
    expected = expected_graphcast(params_of(fine_tuned, which), original["params"])
    assert sorted(exported["params"]) == sorted(original["params"]) == sorted(expected)
    moved = 0
    for module, leaves in original["params"].items():
      assert sorted(exported["params"][module]) == sorted(leaves), module
      for leaf, value in leaves.items():
        got = exported["params"][module][leaf]
        assert got.shape == value.shape and got.dtype == np.float32, (module, leaf)
        np.testing.assert_array_equal(got, expected[module][leaf], err_msg=f"{module}:{leaf}")
        moved += not np.array_equal(got, value)
    # Everything but the decoder's unused mesh MLP (6 arrays) trained away from the fixture.
    assert moved == sum(len(leaves) for leaves in original["params"].values()) - 6
    if which == "ema":
      ema = exported["params"]
    else:
      raw = exported["params"]
  grid = ENCODER + "encoder_nodes_grid_nodes_mlp/~/linear_0"
  assert not np.array_equal(ema[grid]["w"], raw[grid]["w"])


def refused_runs(imported, root):
  """Run directories (a config and nothing else) GraphCast's model cannot express."""
  base = RunDirectory(imported).read_config()
  edits = {
      "fgn": ("model.noise_channels", lambda c: c.model.update(noise_channels=4)),
      "transformer": ("model.processor", lambda c: c.model.update(processor="transformer")),
      "modalities": ("data.modalities", lambda c: c.data.update(modalities=(
          ("stations", "synthetic", ("2m_temperature",), ("2m_temperature",)),))),
      "state_normalization": ("data.input_normalization", lambda c: c.data.update(
          input_normalization="state", stored_forcings=())),
      "computed_solar_radiation": ("data.stored_forcings",
                                   lambda c: c.data.update(stored_forcings=())),
  }
  runs = {}
  for name, (setting, edit) in edits.items():
    config = copy.deepcopy(base)
    edit(config)
    directory = RunDirectory(str(root / name))
    directory.write_config(config_lib.to_json(config_lib.validate(config)), history=False)
    runs[name] = (directory.path, setting)
  return runs


def test_runs_graphcast_cannot_express_are_refused(imported, tmp_path):
  """One error naming the setting, from the config alone (the directories hold no
  checkpoint), nothing written; through the launcher: one line, exit 2."""
  runs = refused_runs(imported, tmp_path)
  for workdir, setting in runs.values():
    with pytest.raises(UserError, match=rf"cannot express this run's {re.escape(setting)}="):
      export_graphcast(workdir, str(tmp_path / "out.npz"), stats_dir=str(tmp_path / "stats"))
  assert not os.path.exists(tmp_path / "out.npz") and not os.path.exists(tmp_path / "stats")
  result = run("export_graphcast", f"--workdir={runs['fgn'][0]}",
               f"--out={tmp_path / 'out.npz'}")
  assert_user_error(result, "model.noise_channels=4", "deterministic")
