"""Every config file loads and validates; invalid configs fail before anything is built."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest

from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.errors import UserError
from wnscale.train import optimizer

from problems import CONFIG_FILES

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "configs")



def test_there_are_configs():
  names = {os.path.basename(p) for p in CONFIG_FILES}
  assert {"tiny.py", "graphcast_1p0.py", "graphcast_0p25.py"} <= names


@pytest.mark.parametrize("path", CONFIG_FILES, ids=os.path.basename)
def test_config_loads_and_validates(path):
  config = config_lib.load(path)
  assert config.model.latent_size >= 1
  with open(path) as f:
    docstring = f.read()
  # Each config documents how to launch it.
  assert "python -m launch." in docstring


@pytest.mark.parametrize("path", CONFIG_FILES, ids=os.path.basename)
def test_a_run_records_its_config_with_the_values_its_specs_resolved(path):
  """`specs.recorded_config`: the config as given, where the specs say nothing new; each
  value replaced on a spec (the store's path, an auto remat's choice) in its place, which
  reads back (`config.from_json`) as those specs."""
  config = config_lib.load(path)
  given = config_lib.to_json(config)
  specs = specs_lib.from_config(config)
  assert specs_lib.recorded_config(specs, given) == given
  resolved = dataclasses.replace(
      specs, data=dataclasses.replace(specs.data, path="/resolved.zarr"),
      model=dataclasses.replace(specs.model, remat=dataclasses.replace(
          specs.model.remat, edge_chunks=4, remat_mesh_gnn=True)))
  recorded = specs_lib.recorded_config(resolved, given)
  assert recorded["data"]["path"] == "/resolved.zarr" and recorded["model"]["edge_chunks"] == 4
  assert recorded["train"] == given["train"]
  assert specs_lib.from_config(config_lib.from_json(json.dumps(recorded))) == resolved


def test_only_the_small_configs_ask_for_a_synthetic_store():
  synthetic = {os.path.basename(path): config_lib.load(path).data.synthetic
               for path in CONFIG_FILES}
  assert synthetic == {"gencast_0p25.py": False, "gencast_1p0.py": False,
                       "graphcast_0p25.py": False,
                       "graphcast_1p0.py": False,
                       "mid_1p0.py": True, "tiny.py": True, "tiny_stations.py": True,
                       "weathernext2_0p25.py": False,
                       "weathernext2_1p0.py": False}
  assert config_lib.default_config().data.synthetic is False


def test_paper_config_matches_graphcast():
  config = config_lib.load(os.path.join(CONFIG_DIR, "graphcast_0p25.py"))
  assert config.model.latent_size == 512
  assert config.model.message_passing_steps == 16
  assert config.model.mesh_levels == 6
  assert len(config.data.pressure_levels) == 37
  assert config.data.resolution == 0.25


def test_gencast_0p25_is_the_1p0_model_on_the_paper_mesh():
  """configs/gencast_0p25.py: configs/gencast_1p0.py's model (GenCast's released code,
  checked in tests/test_gencast_training.py) on a 0.25 deg grid, a mesh of 6 refinements and
  32 attention hops; everything else equal, spherical white noise included."""
  fine = config_lib.to_json(config_lib.load(os.path.join(CONFIG_DIR, "gencast_0p25.py")))
  coarse = config_lib.to_json(config_lib.load(os.path.join(CONFIG_DIR, "gencast_1p0.py")))
  assert (fine["model"]["mesh_levels"], fine["model"]["transformer_k_hop"],
          fine["data"]["resolution"]) == (6, 32, 0.25)
  assert (coarse["model"]["mesh_levels"], coarse["model"]["transformer_k_hop"],
          coarse["data"]["resolution"]) == (5, 16, 1.0)
  assert fine["model"]["sampler_spherical_noise"] is True
  for section, keys in (("model", ("mesh_levels", "transformer_k_hop")),
                       ("data", ("resolution",))):
    for key in keys:
      fine[section].pop(key)
      coarse[section].pop(key)
  assert fine == coarse


def test_weathernext2_configs_are_the_released_models():
  """WeatherNext2.json at 0.25 deg: 24 blocks, width 768, 6 heads, feed-forward 3072, 32
  hops on the finest of 6 refinements; WeatherNextCyclones_Mini.json at 1 deg: 16 blocks,
  width 512, 4 heads, 2048, 16 hops on 5; both: encoder edge latents 32, a receiver-blind
  encoder edge MLP, an FGN trained with CRPS, 13 levels, year progress as a global input,
  sea-surface temperature filled over land."""
  for name, shape in [("weathernext2_0p25.py", (24, 768, 6, 3072, 32, 6, 4.0, 0.25)),
                      ("weathernext2_1p0.py", (16, 512, 4, 2048, 16, 5, 1.0, 1.0))]:
    config = config_lib.load(os.path.join(CONFIG_DIR, name))
    m, d = config.model, config.data
    assert (m.transformer_layers, m.latent_size, m.transformer_heads, m.transformer_ffw_size,
            m.transformer_k_hop, m.mesh_levels, m.grid_to_mesh_aggregate_normalization,
            d.resolution) == shape, name
    assert (m.processor, m.edge_latent_size, m.grid_to_mesh_gather_from_receivers,
            m.noise_channels, config.train.loss) == ("transformer", 32, False, 32, "crps")
    assert len(d.pressure_levels) == 13 and "sea_surface_temperature" in d.variables
    assert d.global_forcings == ("year_progress_sin", "year_progress_cos")
    assert d.nan_fill_values == ("sea_surface_temperature:269.48291015625",)


@pytest.mark.parametrize("section, key, value, message", [
    ("model", "remat_policy", "save_some", "Unknown remat policy 'save_some'"),
    ("model", "remat_policy", "save_only_these_names:bogus", "unknown checkpoint names"),
    ("model", "dtype", "float16", "model.dtype"),
    ("model", "edge_chunks", 0, "model.edge_chunks=0"),
    ("model", "mesh_to_grid_edge_normalization", -0.6, "mesh_to_grid_edge_normalization"),
    ("mesh", "exchange", "broadcast", "mesh.exchange"),
    ("data", "variables", ("temperature", "cloud_cover"), "Unknown variable 'cloud_cover'"),
    ("data", "pressure_levels", (500, 505), r"\[505\] are not ERA5 pressure levels"),
    ("train", "warmup_steps", -1, "train.warmup_steps=-1 must be >= 0"),
    ("train", "steps", 0, "train.steps=0 must be >= 1"),
    ("train", "accumulation_steps", 0, "train.accumulation_steps=0 must be >= 1"),
    ("train", "accumulation_steps", 3, "train.batch_size=2 does not split into "
     "train.accumulation_steps=3 micro-batches"),
    ("train", "learning_rate", 0.0, "train.learning_rate=0.0 must be > 0"),
    ("train", "learning_rate", -1e-3, "train.learning_rate=-0.001 must be > 0"),
    ("data", "target_only_variables", ("temperature",),
     r"target_only_variables \['temperature'\] are in data.variables too"),
    ("data", "forcings", ("cos_day_progress",), r"\['cos_day_progress'\] are not forcings"),
    ("data", "stored_forcings", ("land_sea_mask",), "not in data.forcings"),
    ("data", "stored_forcings", ("toa_incident_solar_radiation",),
     "set data.input_normalization='all'"),
    ("data", "input_normalization", "some", "data.input_normalization='some'"),
    ("data", "grid", "N320", r"data.grid='N320': Unknown grid 'N320': name an octahedral"),
    ("train", "rollout_schedule", ((5, 1), (100, 2)), "the first at 0"),
    ("train", "rollout_schedule", ((0, 1), (300, 2)), "all before train.steps=200"),
    ("train", "rollout_schedule", ((0, 1), (50, 0)), "target_steps must be >= 1"),
    ("train", "rollout_schedule", ("0:1:2",), r"rollout_schedule entry '0:1:2': 3 parts"),
    ("train", "phase_learning_rates", ("1e-3", "3e-7"), "2 entries for 1 phase"),
    ("train", "phase_learning_rates", ("1e-3:200",), r"a warm-up shorter than the phase "
     r"\(200 steps\)"),
    ("train", "ema_decay", 1.0, r"train.ema_decay=1.0 must be in \[0, 1\)"),
])
def test_invalid_values_are_rejected(section, key, value, message):
  config = config_lib.default_config()
  config[section][key] = value
  with pytest.raises(UserError, match=message):
    config_lib.validate(config)


def test_a_warm_up_longer_than_the_run_is_valid_and_clipped():
  config = config_lib.default_config()
  config.train.update(steps=3, warmup_steps=20)
  train = specs_lib.from_config(config_lib.validate(config)).train
  assert optimizer.warmup_steps(train) == 2
  schedule = optimizer.learning_rate_schedule(train)
  assert float(schedule(0)) == 0.0
  assert float(schedule(2)) == pytest.approx(config.train.learning_rate, rel=1e-6)


def test_unknown_key_is_rejected_with_the_nearest_key():
  config = config_lib.default_config()
  config.model.latent = 3
  with pytest.raises(UserError, match="Unknown config key 'model.latent'; did you mean "
                     "model.latent_size?"):
    config_lib.validate(config)
  with pytest.raises(UserError, match=r"'model.depth'\. Every key"):  # nothing close
    config_lib.check_key("model.depth")
  with pytest.raises(UserError, match="'trian.steps'; did you mean train.steps?"):
    config_lib.check_key("trian.steps")
  with pytest.raises(UserError, match="'train.step'; did you mean train.steps?"):
    config_lib.check_key("train.step")
  config_lib.check_key("train.steps")


def test_loading_and_validating_a_config_imports_neither_flax_nor_the_model():
  """A mistake in a config is reported without waiting for Flax (seconds of imports)."""
  script = textwrap.dedent("""
      import sys
      from wnscale import config as config_lib
      from wnscale import specs as specs_lib
      from wnscale.errors import UserError
      config = config_lib.load("tiny")
      config.model.update(processor="transformer", transformer_heads=4)
      specs_lib.from_config(config_lib.validate(config))
      config.model.latent_size = -1
      try:
        config_lib.validate(config)
      except UserError as error:
        print(error)
      loaded = {"flax", "wnscale.model.graphcast", "wnscale.model.mesh_gnn",
                "wnscale.model.mesh_transformer"} & set(sys.modules)
      print(sorted(loaded))
  """)
  output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, cwd=os.path.dirname(CONFIG_DIR)).stdout
  assert output.splitlines() == ["Invalid config: model.latent_size=-1 must be >= 1.", "[]"]


def test_both_mesh_axes_free_is_rejected():
  config = config_lib.default_config()
  config.mesh.graph = -1
  with pytest.raises(ValueError, match="at most one of mesh.data and mesh.graph"):
    config_lib.validate(config)


def test_wrong_type_is_rejected():
  config = config_lib.default_config()
  with pytest.raises(TypeError, match="latent_size"):
    config.model.latent_size = 32.5  # ConfigDict itself refuses on assignment
  config.model = dict(config.model, latent_size="wide")  # a section replaced wholesale
  with pytest.raises(ValueError, match="model.latent_size='wide' must be of type int"):
    config_lib.validate(config)


def test_the_paper_configs_carry_graphcasts_whole_schedule():
  """300,000 steps of 1-step training (warm-up to 1e-3, half-cosine to 0), then 1,000 steps
  at each of 2..12 autoregressive steps at 3e-7; the memory planner and remat_policy="auto"
  size the 12-step phase."""
  from wnscale.train import curriculum  # noqa: PLC0415
  for name in ("graphcast_0p25.py", "graphcast_1p0.py"):
    config = config_lib.load(os.path.join(CONFIG_DIR, name))
    specs = specs_lib.from_config(config)
    train = specs.train
    assert train.rollout_schedule[:2] == ((0, 1), (300_000, 2))
    assert train.rollout_schedule[-1] == (310_000, 12) and train.steps == 311_000
    schedule = optimizer.learning_rate_schedule(train)
    assert float(schedule(1_000)) == pytest.approx(1e-3)
    assert float(schedule(299_999)) == pytest.approx(0, abs=1e-9)
    assert [float(schedule(step)) for step in (300_000, 305_500, 310_999)] == pytest.approx(
        [3e-7] * 3)
    assert curriculum.longest_phase_specs(specs).data.target_steps == 12
    assert specs.data.target_steps == 1  # evaluation's lead times


# --- Configs by name, from any directory -----------------------------------------------------

@pytest.mark.parametrize("name", ["tiny", "tiny.py", "configs/tiny.py", "./configs/tiny.py"])
def test_a_config_is_found_by_name_from_any_directory(tmp_path, monkeypatch, name):
  monkeypatch.chdir(tmp_path)  # no configs/ here
  path = config_lib.config_file(name)
  assert os.path.samefile(path, os.path.join(CONFIG_DIR, "tiny.py"))
  assert config_lib.load(name).data.synthetic is True


def test_a_file_in_the_working_directory_comes_first(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "tiny.py").write_text(
      "from wnscale.config import default_config\n\n"
      "def get_config():\n  config = default_config()\n  config.train.steps = 7\n"
      "  return config\n")
  assert config_lib.config_file("tiny.py") == "tiny.py"
  assert config_lib.load("tiny.py").train.steps == 7
  assert config_lib.load("tiny").train.steps == 200  # a name: the experiment of configs/


def test_a_config_argument_follows_the_name(tmp_path):
  path = config_lib.config_file(f"imported:{tmp_path}")
  assert path == os.path.join(config_lib.CONFIGS_DIR, "imported.py") + f":{tmp_path}"
  with pytest.raises(ValueError, match=f"No config.json in {tmp_path}"):
    config_lib.load(f"imported:{tmp_path}")  # the argument reached get_config


def test_an_unknown_config_names_the_experiments(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(UserError, match=r"^config=tiyn: no such config file: give a path .* or "
                     r"the name of an experiment in .*configs: gencast_0p25, gencast_1p0, "
                     r"graphcast_0p25, "
                     r".*tiny, .*"
                     r"\(e\.g\. `config=tiny`"):
    config_lib.config_file("tiyn")
  with pytest.raises(UserError, match="config=elsewhere/tiny.py: no such config file"):
    config_lib.config_file("elsewhere/tiny.py")  # a path that is not there stays a path


def test_the_experiments_are_installed_where_they_are_looked_for():
  """configs/ is installed beside the packages (pyproject.toml), where CONFIGS_DIR looks."""
  import tomllib  # noqa: PLC0415
  with open(os.path.join(CONFIG_DIR, "..", "pyproject.toml"), "rb") as f:
    find = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]
  assert "configs" in find["include"]
  assert os.path.samefile(config_lib.CONFIGS_DIR, CONFIG_DIR)
  assert set(config_lib.experiment_names()) >= {"tiny", "graphcast_0p25", "imported"}
