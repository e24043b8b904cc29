"""Every config file loads and validates; invalid configs fail before anything is built."""

import glob
import os

import pytest

from wnscale import config as config_lib

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "configs")
# configs/imported.py takes a run directory (test_graphcast_import.py loads it).
CONFIG_FILES = sorted(path for path in glob.glob(os.path.join(CONFIG_DIR, "*.py"))
                      if os.path.basename(path) != "imported.py")


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


def test_only_the_small_configs_ask_for_a_synthetic_store():
  synthetic = {os.path.basename(path): config_lib.load(path).data.synthetic
               for path in CONFIG_FILES}
  assert synthetic == {"graphcast_0p25.py": False, "graphcast_1p0.py": False,
                       "mid_1p0.py": True, "tiny.py": True}
  assert config_lib.default_config().data.synthetic is False


def test_paper_config_matches_graphcast():
  config = config_lib.load(os.path.join(CONFIG_DIR, "graphcast_0p25.py"))
  assert config.model.latent_size == 512
  assert config.model.message_passing_steps == 16
  assert config.model.mesh_levels == 6
  assert len(config.data.pressure_levels) == 37
  assert config.data.resolution == 0.25


@pytest.mark.parametrize("section, key, value, message", [
    ("model", "remat_policy", "save_some", "Unknown remat policy 'save_some'"),
    ("model", "remat_policy", "save_only_these_names:bogus", "unknown checkpoint names"),
    ("model", "dtype", "float16", "model.dtype"),
    ("model", "edge_chunks", 0, "model.edge_chunks=0"),
    ("model", "mesh_to_grid_edge_normalization", -0.6, "mesh_to_grid_edge_normalization"),
    ("mesh", "exchange", "broadcast", "mesh.exchange"),
    ("data", "variables", ("temperature", "cloud_cover"), "Unknown variable 'cloud_cover'"),
    ("data", "pressure_levels", (500, 505), r"\[505\] are not ERA5 pressure levels"),
    ("train", "warmup_steps", 500, "warmup_steps"),
    ("data", "target_only_variables", ("temperature",),
     r"target_only_variables \['temperature'\] are in data.variables too"),
    ("data", "forcings", ("cos_day_progress",), r"\['cos_day_progress'\] are not forcings"),
    ("data", "stored_forcings", ("land_sea_mask",), "not in data.forcings"),
    ("data", "stored_forcings", ("toa_incident_solar_radiation",),
     "set data.input_normalization='all'"),
    ("data", "input_normalization", "some", "data.input_normalization='some'"),
])
def test_invalid_values_are_rejected(section, key, value, message):
  config = config_lib.default_config()
  config[section][key] = value
  with pytest.raises(ValueError, match=message):
    config_lib.validate(config)


def test_unknown_key_is_rejected():
  config = config_lib.default_config()
  config.model.num_layers = 3
  with pytest.raises(ValueError, match="unknown key 'model.num_layers'"):
    config_lib.validate(config)


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
