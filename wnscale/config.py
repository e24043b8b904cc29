"""Every knob of a wnscale experiment, with its default and meaning, in one place.

Experiment files in `configs/` start from `default_config()` and override what
they change. `validate(config)` rejects impossible settings before anything
is built or compiled.
"""

from __future__ import annotations

import difflib
import glob
import json
import os

import ml_collections

from wnscale import specs as specs_lib
from wnscale.data import forcings as forcings_lib
from wnscale.data import variables as variables_lib
from wnscale.errors import ArgumentError, UserError
from wnscale.graphs import points as points_lib
from wnscale.model.loss_registry import LOSSES
from wnscale.model.processors import PROCESSORS


def default_config() -> ml_collections.ConfigDict:
  """The defaults; the comment after each key is its documentation.

  Each section's keys are the fields of its spec in `wnscale.specs` (what the
  code below the launchers reads): a new key is a new field there too.
  """
  c = ml_collections.ConfigDict()
  c.seed = 0  # seeds parameter init, data shuffling and the synthetic store

  c.model = m = ml_collections.ConfigDict()
  m.latent_size = 32  # width of every node and edge latent and MLP hidden layer
  m.mesh_levels = 2  # icosahedron refinements; the multi-mesh merges levels 0..mesh_levels
  m.regional_mesh_levels = 0  # a cut-out (data.regional_path): this many more refinements
  # of the faces inside its region (the regional points' spherical convex hull), so the
  # processor resolves it; the encoder's radius is then each mesh node's own (radius_fraction
  # x the longest edge of its faces); interaction_network processor only
  m.radius_fraction = 0.6  # grid->mesh radius, as a fraction of the finest mesh edge
  m.mesh_to_grid_edge_normalization = 0.0  # mesh->grid edge features are divided by this;
  # 0.0: by the longest mesh->grid edge (as the other edge sets always are). GraphCast's
  # published checkpoints carry 0.6180338738074472 (their ModelConfig's
  # mesh2grid_edge_normalization_factor); running one needs that value.
  m.edge_latent_size = 0  # encoder/decoder edge latents (edge embedder width, edge MLP
  # input); 0: latent_size. WeatherNext 2: 32 (its node latents: 768)
  m.processor = "interaction_network"  # the mesh processor, a name from
  # wnscale.model.processors.PROCESSORS: "interaction_network" (GraphCast's message passing on
  # the multi-mesh) or "transformer" (WeatherNext 2's: attention within k-hop neighbourhoods of
  # the finest mesh, width latent_size)
  m.update(owned_defaults("model"))  # each processor's keys, then the remat keys (their
  # meanings: where they are declared, wnscale.model.processors.GNNSpec, ...;
  # docs/config_reference.md)
  m.dtype = "float32"  # activation dtype, "float32" or "bfloat16"; parameters stay float32
  m.grid_to_mesh_gather_from_receivers = True  # the encoder's edge MLP sees each edge's
  # receiver (mesh node) latent too (GraphCast); False: its edge and sender only (WeatherNext 2)
  m.grid_to_mesh_aggregate_normalization = 1.0  # the encoder's messages summed per mesh node
  # are divided by this before the node update (WeatherNext 2: 4)
  m.output_activations = ()  # entries "variable:activation" or "variable:activation:offset":
  # the network's normalized output of that (target-only) variable plus the offset goes
  # through the activation (wnscale.model.dtypes_and_activations.OUTPUT_ACTIVATIONS), e.g. WeatherNext 2's
  # "cyclone_exists_gaussian_unit_mode:sigmoid:-2"
  m.noise_channels = 0  # 0: deterministic; > 0: an FGN (WeatherNext 2: 32): each member draws
  # this many standard-normal numbers per example and step, and every layer norm is
  # conditioned on their embedding (wnscale.model.norm)

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # devices along the batch axis; -1: the devices left over
  c.mesh.graph = 1  # devices along the space axis (grid, mesh nodes and edges)
  c.mesh.exchange = "all_gather"  # how shards get remote sender rows: all_gather | halo

  c.data = d = ml_collections.ConfigDict()
  d.path = ""  # zarr store, a local path or a URL (gs://...): WeatherBench2's layout (a
  # regular grid, or `values` points), or an anemoi-datasets store (found by its layout)
  d.member = 0  # the ensemble member read from an anemoi-datasets store of several
  d.synthetic = False  # with no data.path: train on a synthetic ERA5-like store, written
  # once into the cache directory ($WNSCALE_CACHE_DIR, default ~/.cache/wnscale/datasets)
  d.stats_path = ""  # normalization statistics to use (path or URL): a wnscale .nc file, or a
  # directory of GraphCast's mean_by_level.nc, stddev_by_level.nc, diffs_stddev_by_level.nc,
  # or an anemoi-datasets store (its own statistics; diff_std from its tendencies over
  # data.time_step_hours); empty: computed once from the training range, cached in
  # <cache dir>/stats
  d.regional_path = ""  # a limited-area cut-out: a fine regional store (a regular box or
  # points, either layout, the variables and levels of data.path) whose points replace
  # data.path's inside the region (wnscale.graphs.region); the model runs on the joined
  # points, at the times both stores hold, with the global store's statistics
  d.region = ""  # the cut-out's region, "lat0,lat1,lon0,lon1" degrees (longitude eastwards
  # from lon0, across 0 where lon1 < lon0): the regional points inside it replace the global
  # points inside it; "": the spherical convex hull of all the regional points
  d.regional_loss_weight = 1.0  # the region's points' loss weight: multiplies their cell
  # areas (each point weighs its area; the rest weigh theirs times 1)
  d.resolution = 5.625  # grid spacing in degrees of a regular store; must match it (a store
  # of other points says its own grid, and this is not used)
  d.grid = ""  # the grid of the synthetic store (data.synthetic) and of the planner and
  # graph_info, which have no store: "" the regular grid of data.resolution; "O32", "O96":
  # an octahedral reduced Gaussian grid; "H16": a HEALPix grid (wnscale.graphs.points)
  d.variables = ("temperature", "geopotential", "u_component_of_wind",
                 "v_component_of_wind", "specific_humidity", "2m_temperature",
                 "mean_sea_level_pressure")  # state variables (inputs and targets),
  # WeatherBench2 names
  d.target_only_variables = ()  # predicted but never inputs (GraphCast_operational's
  # total_precipitation_6hr): the network predicts them outright, normalized by mean and
  # std, no residual
  d.pressure_levels = (500, 850)  # hPa, subset of the store's levels
  d.forcings = variables_lib.FORCING_CHANNELS  # forcing channels, fed at every input time
  # and the target time: toa_incident_solar_radiation, day_progress_sin/cos,
  # year_progress_sin/cos (a subset, in any order)
  d.stored_forcings = ()  # forcings read from the store instead of computed, e.g.
  # ("toa_incident_solar_radiation",): ERA5's 1-hour integral in J m^-2, as GraphCast was
  # trained on (computed: an instantaneous proxy, wnscale.data.forcings); needs
  # input_normalization="all"
  d.input_normalization = "state"  # "state": the state and the surface geopotential as
  # (x - mean) / std, the land-sea mask and the forcings as they are (wnscale's own);
  # "all": every input, forcings and statics included (GraphCast's)
  d.input_steps = 2  # input times (t - 6h, t)
  d.target_steps = 1  # autoregressive lead times in the loss
  d.time_step_hours = 6  # model time step; finer stores are subsampled
  d.global_forcings = ()  # forcings without position, given to every grid and mesh node
  # embedder (WeatherNext 2's year progress), names from data.forcings.GLOBAL_FORCINGS
  d.train_start = "2020-01-01"  # training time range (inclusive)
  d.train_end = "2020-10-31"  # last day of the training range (inclusive)
  d.eval_start = "2020-11-01"  # held-out time range for evaluation
  d.eval_end = "2020-12-31"  # last day of the evaluation range (inclusive)
  d.worker_count = 0  # Grain worker processes (0: read in the main process)
  d.fill_nan = False  # False: a NaN in a required input is an error
  d.nan_fill_values = ()  # entries "variable:value": NaN of that variable is replaced by the
  # value (physical units) wherever the model reads it, and its forecasts are NaN where an
  # input time was (WeatherNext 2's sea-surface temperature over land:
  # "sea_surface_temperature:269.48291015625")
  d.modalities = ()  # point sets beside the grid, on the same mesh: entries (name, source,
  # inputs, targets[, loss_weight]), e.g. ("stations", "obs.zarr", ("2m_temperature",),
  # ("2m_temperature", "mean_sea_level_pressure"), 1.0); source: an observation store
  # (wnscale.data.reading.observations: dims (time, station), NaN missing; its statistics
  # from the training range) or "synthetic[:N]": N stations (default 500) of data.path's
  # grid written once into the cache directory (wnscale.data.making.stations); node set
  # `name` with its own embedder, encoder edges `name_to_mesh` (radius query; a point with no mesh node in range
  # joins its nearest) if it has inputs, decoder edges `mesh_to_name` and output MLP if it
  # has targets; inputs and targets are WeatherBench2 surface variables, NaN where missing
  # (a missing input enters as 0 with a mask channel, a missing target leaves the loss);
  # loss_weight (default 1) scales its point-weighted MSE in the loss

  c.train = t = ml_collections.ConfigDict()
  t.steps = 200  # optimizer steps
  t.batch_size = 2  # global batch (examples per step over all data shards)
  t.accumulation_steps = 1  # the batch in this many micro-batches of batch_size /
  # accumulation_steps examples, run one after another inside the step (each data shard
  # splits its own examples, so theirs must split evenly too) and their gradients summed
  # (wnscale.model.accumulation): the loss, the gradient the optimizer sees and the metrics
  # are the whole batch's (to float rounding), the activation memory one micro-batch's
  t.learning_rate = 1e-3  # peak learning rate after warm-up
  t.end_learning_rate = 3e-7  # learning rate at the end of the cosine decay
  t.warmup_steps = 20  # linear warm-up steps (clipped to steps - 1 for a shorter run)
  t.weight_decay = 0.1  # AdamW decoupled weight decay
  t.adam_b1 = 0.9  # AdamW: decay of the gradients' moving average (first moment)
  t.adam_b2 = 0.95  # AdamW: decay of the squared gradients' moving average (second moment)
  t.grad_clip_norm = 32.0  # global-norm gradient clipping
  t.remat_rollout = False  # backpropagate through the rollout keeping one state a step, in
  # host memory, and running each step again (wnscale.model.rollout_loss); False: every
  # step's activations stay in device memory
  t.loss = "mse"  # the training loss, a name from wnscale.model.loss_registry.LOSSES:
  # "mse": weighted MSE (GraphCast); "crps": fair CRPS over ensemble_members members per
  # example with the same weights (WeatherNext 2; needs model.noise_channels > 0);
  # "diffusion": GenCast's denoising loss of a denoiser (model.denoiser_noise_frequencies
  # > 0; one step, wnscale.model.diffusion)
  t.update(owned_defaults("train"))  # each loss's keys (their meanings: where they are
  # declared, wnscale.model.loss_registry.CRPSSpec, DiffusionSpec; docs/config_reference.md)
  t.log_every = 10  # steps between progress lines / metrics.jsonl entries
  t.prefetch_batches = 2  # batches read and placed on the devices ahead of the step by a
  # background thread (wnscale.data.prefetch); 0: each read when the step needs it
  t.eval_every = 100  # steps between evaluations (0: never)
  t.eval_batches = 4  # an evaluation reads the first eval_batches batches of the eval range
  t.checkpoint_every = 100  # steps between asynchronous checkpoints
  t.max_checkpoints = 3  # checkpoints kept
  t.memory_budget_gib = 0.0  # per-device memory for remat_policy="auto"; 0: the device's memory
  t.variable_loss_weights = ()  # entries "variable:weight": that variable's loss weight
  # instead of its catalogue one (wnscale.data.variables; GraphCast's), e.g. WeatherNext 2's
  # "geopotential:0.5"
  t.init_from = ""  # a run directory (e.g. from launch.import_graphcast) whose newest
  # parameters start this run (not its optimizer state; a run resumed from its own
  # checkpoint ignores it); model and data keys must give the same parameter shapes
  t.rollout_schedule = ()  # the rollout curriculum: (first_step, target_steps) pairs, the
  # first at step 0, e.g. ((0, 1), (300000, 2), (301000, 3)); each phase trains on rollouts of
  # its length (backpropagating through all of them) and compiles its own step when it
  # starts; evaluation keeps data.target_steps. (): data.target_steps throughout
  t.phase_learning_rates = ()  # one entry per rollout_schedule phase,
  # "peak[:warmup_steps[:end]]": the phase's own schedule, a linear warm-up from 0 to peak,
  # then a half-cosine to end over the rest of the phase (no end: constant at peak), e.g.
  # GraphCast's ("1e-3:1000:0", "3e-7", ...); (): one schedule over the whole run
  # (learning_rate, warmup_steps, end_learning_rate)
  t.ema_decay = 0.0  # > 0 (e.g. 0.9999): keep an exponential moving average of the
  # parameters (updated every step, checkpointed); evaluation, launch.forecast and
  # launch.predict_example use it (--params=raw: the raw parameters); 0: none
  t.freeze = ()  # parameter-path prefixes never updated and given no optimizer state, e.g.
  # ("grid_to_mesh", "mesh_to_grid") or ("processor",) (dotted paths: "processor.layers_0")
  t.trackers = ("tensorboard",)  # where the run's metrics, config and tags also go, besides
  # metrics.jsonl (wnscale.tracking): any of "tensorboard" (events under tensorboard/),
  # "mlflow" (MLFLOW_TRACKING_URI, else a SQLite store under mlflow/; pip install
  # 'wnscale[mlflow]'), "wandb" (Weights & Biases: WANDB_MODE, WANDB_PROJECT; offline under
  # wandb/ without credentials; pip install 'wnscale[wandb]'); (): metrics.jsonl alone
  return c


def graphcast_paper_config(resolution: float) -> ml_collections.ConfigDict:
  """The GraphCast paper's model, data and training schedule on a grid of `resolution` degrees.

  Latent 512, 16 message-passing steps, multi-mesh levels 0..6, 6 atmospheric
  variables on 37 levels plus 5 surface variables, bfloat16 activations, and the
  paper's remat scheme: whole encoder and decoder, every 3 processor steps, and
  the encoder/decoder edges in blocks.
  """
  c = default_config()
  m = c.model
  m.latent_size = 512
  m.mesh_levels = 6
  m.message_passing_steps = 16
  m.remat_grid_to_mesh_gnn = True
  m.remat_mesh_gnn = True
  m.remat_mesh_to_grid_gnn = True
  m.mesh_remat_every = 3
  m.edge_chunks = 4
  m.dtype = "bfloat16"
  d = c.data
  d.resolution = resolution
  d.variables = tuple(v.name for v in variables_lib.ATMOSPHERIC_VARIABLES
                      + variables_lib.SURFACE_VARIABLES)
  d.pressure_levels = variables_lib.ERA5_LEVELS_37
  d.train_start, d.train_end = "1979-01-01", "2017-12-31"
  d.eval_start, d.eval_end = "2018-01-01", "2018-12-31"
  t = c.train
  t.batch_size = 32
  t.warmup_steps = 1_000
  t.learning_rate = 1e-3
  # 300,000 steps on 1-step rollouts (warm-up to 1e-3, half-cosine to 0), then 1,000 steps at
  # each of 2..12 autoregressive steps at a constant 3e-7, backpropagating through them all.
  t.rollout_schedule = ((0, 1),) + tuple((300_000 + 1_000 * (n - 2), n) for n in range(2, 13))
  t.steps = t.rollout_schedule[-1][0] + 1_000
  t.phase_learning_rates = ("1e-3:1000:0",) + ("3e-7",) * 11
  t.log_every = 100
  t.eval_every = 5_000
  t.checkpoint_every = 1_000
  return c


def derived_config(resolution: float, keys: dict) -> ml_collections.ConfigDict:
  """GraphCast's schedule and time ranges on a grid of `resolution` degrees, with
  `keys` (`{"section.key": value}`) set: a config file derived from another
  framework's (`tools/derive_weathernext2_config.py` writes WeatherNext 2's). Of
  GraphCast's rollout curriculum, only its first phase (1-step training) is kept."""
  config = graphcast_paper_config(resolution)
  first_phase_end = config.train.rollout_schedule[1][0]
  config.train.update(rollout_schedule=(), phase_learning_rates=(), steps=first_phase_end)
  for key, value in keys.items():
    section, name = key.split(".")
    config[section][name] = value
  return validate(config)


def owned_settings() -> list[type[specs_lib.Settings]]:
  """The settings that components declare (each registered processor's, the remat's, the
  denoiser's and its sampler's, each registered loss's): their keys are keys of their
  `SECTION`, with their defaults and meanings."""
  return ([entry.spec for entry in PROCESSORS.values()]
          + [specs_lib.RematSpec, specs_lib.DenoiserSpec, specs_lib.SamplerSpec]
          + [entry.spec for entry in LOSSES.values()])


def owned_defaults(section: str) -> dict:
  """`{key: default}` of the `owned_settings` of the config section `section`."""
  return {key: value for settings in owned_settings() if settings.SECTION == section
          for key, value in settings.defaults().items()}


def _require(condition: bool, message: str):
  if not condition:
    raise UserError(f"Invalid config: {message}.")


def key_paths(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  """Every key of `config` as a dotted path (`train.steps`), sections included."""
  paths = []
  for key, value in config.items():
    paths.append(prefix + key)
    if isinstance(value, ml_collections.ConfigDict):
      paths.extend(key_paths(value, prefix + key + "."))
  return paths


def check_key(path: str):
  """A `UserError` suggesting the nearest key when `path` (`train.step`) is no config key."""
  known = key_paths(default_config())
  if path in known:
    return
  # Compare names within the key's section: "train." alone makes every train key look close.
  section = path.rpartition(".")[0]
  siblings = {key.rpartition(".")[2]: key for key in known if key.rpartition(".")[0] == section}
  if siblings:
    nearest = [siblings[name] for name in difflib.get_close_matches(
        path.rpartition(".")[2], siblings, n=1, cutoff=0.7)]
  else:
    nearest = difflib.get_close_matches(path, known, n=1, cutoff=0.7)
  hint = f"; did you mean {nearest[0]}?" if nearest else "."
  raise UserError(f"Unknown config key {path!r}{hint} Every key, with its default and "
                  "meaning, is listed in wnscale/config.py.")


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Checks keys, types and combinations against `default_config()`; returns `config`.

  The processor's name and the bounds and choices of the components' own settings
  (`owned_settings`) are checked first, so that the specs can be made; the other names
  picked from registries (policies, dtypes, ...) and the chosen processor's own checks
  last (`_check_registered_names`).
  """
  _check_keys_and_types(default_config(), config, prefix="")
  m, d, t = config.model, config.data, config.train
  _require(m.processor in PROCESSORS,
           f"model.processor={m.processor!r}, expected one of {tuple(PROCESSORS)}")
  _require(t.loss in LOSSES, f"train.loss={t.loss!r}, expected one of {tuple(LOSSES)}")
  for settings in owned_settings():
    problem = settings.problem(config[settings.SECTION])
    _require(problem is None, problem)
  specs = specs_lib.from_config(config)  # the keys' types are checked: parse them once
  _require(m.latent_size >= 1, f"model.latent_size={m.latent_size} must be >= 1")
  _require(m.edge_latent_size >= 0, f"model.edge_latent_size={m.edge_latent_size} must be >= 0")
  _require(0 <= m.mesh_levels <= 8, f"model.mesh_levels={m.mesh_levels} must be in 0..8")
  _require(0 <= m.regional_mesh_levels <= 6,
           f"model.regional_mesh_levels={m.regional_mesh_levels} must be in 0..6")
  if m.regional_mesh_levels:
    _require(d.regional_path, f"model.regional_mesh_levels={m.regional_mesh_levels} refines "
             "a cut-out's region: it needs data.regional_path")
  _require(m.radius_fraction > 0, "model.radius_fraction must be > 0")
  _require(m.mesh_to_grid_edge_normalization >= 0,
           "model.mesh_to_grid_edge_normalization must be >= 0 (0: the longest edge)")
  for axis in ("data", "graph"):
    size = config.mesh[axis]
    _require(size == -1 or size >= 1, f"mesh.{axis}={size} must be >= 1 or -1")
  _require(not (config.mesh.data == -1 and config.mesh.graph == -1),
           "at most one of mesh.data and mesh.graph may be -1")
  for name in d.variables:
    variables_lib.lookup(name)  # raises naming the unknown variable
  _require(len(d.variables) > 0, "data.variables is empty")
  unknown = [level for level in d.pressure_levels if level not in variables_lib.ERA5_LEVELS_37]
  _require(not unknown, f"data.pressure_levels {unknown} are not ERA5 pressure levels "
           f"{variables_lib.ERA5_LEVELS_37}")
  for name in d.global_forcings:
    _require(name in forcings_lib.GLOBAL_FORCINGS,
             f"data.global_forcings: unknown {name!r}, expected names from "
             f"{forcings_lib.GLOBAL_FORCINGS}")
  _require(len(set(d.global_forcings)) == len(d.global_forcings),
           f"data.global_forcings={d.global_forcings} repeats a name")
  for name in d.target_only_variables:
    variables_lib.lookup(name)
  both = sorted(set(d.variables) & set(d.target_only_variables))
  _require(not both, f"data.target_only_variables {both} are in data.variables too")
  has_levels = any(variables_lib.lookup(n).atmospheric
                   for n in specs.data.outputs)
  _require(not has_levels or len(d.pressure_levels) > 0,
           "data.pressure_levels is empty but atmospheric variables are requested")
  unknown = [name for name in d.forcings if name not in variables_lib.FORCING_CHANNELS]
  _require(not unknown, f"data.forcings {unknown} are not forcings; known: "
           f"{variables_lib.FORCING_CHANNELS}")
  _require(len(set(d.forcings)) == len(d.forcings), f"data.forcings {d.forcings} repeat a name")
  unknown = [name for name in d.stored_forcings if name not in d.forcings]
  _require(not unknown, f"data.stored_forcings {unknown} are not in data.forcings "
           f"{d.forcings}")
  _require(not d.stored_forcings or d.input_normalization == "all",
           f"data.stored_forcings {d.stored_forcings} are read in physical units (ERA5's solar "
           "radiation: J m^-2) and need their statistics: set data.input_normalization='all'")
  _require(d.input_steps >= 1 and d.target_steps >= 1,
           "data.input_steps and data.target_steps must be >= 1")
  _require(d.member >= 0, "data.member must be >= 0")
  _require(d.regional_loss_weight >= 0,
           f"data.regional_loss_weight={d.regional_loss_weight} must be >= 0")
  if specs.data.region_box is not None:
    _require(d.regional_path, f"data.region={d.region!r} needs data.regional_path (the "
             "regional store cut into data.path inside the box)")
  _require(d.resolution > 0 and d.time_step_hours > 0,
           "data.resolution and data.time_step_hours must be > 0")
  if d.grid:
    try:
      points_lib.grid_maker(d.grid)
    except UserError as error:
      raise UserError(f"Invalid config: data.grid={d.grid!r}: {error}") from None
  for key in ("steps", "batch_size", "accumulation_steps"):
    _require(t[key] >= 1, f"train.{key}={t[key]} must be >= 1")
  _require(t.batch_size % t.accumulation_steps == 0,
           f"train.batch_size={t.batch_size} does not split into train.accumulation_steps="
           f"{t.accumulation_steps} micro-batches of whole examples: make the batch a multiple "
           "of the micro-batch count")
  # A warm-up longer than the run is clipped to it (optimizer.learning_rate_schedule).
  _require(t.warmup_steps >= 0, f"train.warmup_steps={t.warmup_steps} must be >= 0")
  _require(t.learning_rate > 0, f"train.learning_rate={t.learning_rate} must be > 0")
  _require(0 <= t.end_learning_rate <= t.learning_rate,
           f"train.end_learning_rate={t.end_learning_rate} must be in "
           f"[0, train.learning_rate={t.learning_rate}]")
  _require(t.weight_decay >= 0 and t.grad_clip_norm > 0,
           "train.weight_decay must be >= 0 and train.grad_clip_norm > 0")
  for key in ("log_every", "checkpoint_every", "max_checkpoints"):
    _require(t[key] >= 1, f"train.{key} must be >= 1")
  _require(t.eval_every >= 0, "train.eval_every must be >= 0")
  _require(t.prefetch_batches >= 0, "train.prefetch_batches must be >= 0")
  _require(t.memory_budget_gib >= 0, "train.memory_budget_gib must be >= 0")
  _check_recipe(specs.train)
  for name, activation, _ in specs.model.output_activations:
    _require(name in specs.data.target_only_variables,
             f"model.output_activations: {name!r} is not in data.target_only_variables "
             f"{d.target_only_variables} (an activation applies to an outright prediction)")
  for name, weight in specs.train.variable_loss_weights:
    _require(name in specs.data.outputs and weight >= 0, f"train.variable_loss_weights: "
             f"{name}:{weight} must name one of the model's variables {specs.data.outputs} "
             "and a weight >= 0")
  for name, _ in specs.data.nan_fill_values:
    _require(name in specs.data.outputs, f"data.nan_fill_values: {name!r} is not one of the "
             f"model's variables {specs.data.outputs}")
  _check_modalities(specs.data)
  _require(m.grid_to_mesh_aggregate_normalization > 0,
           "model.grid_to_mesh_aggregate_normalization must be > 0")
  _require(m.noise_channels >= 0, f"model.noise_channels={m.noise_channels} must be >= 0")
  _require(not (m.noise_channels and m.denoiser_noise_frequencies),
           f"model.noise_channels={m.noise_channels} (an FGN) and "
           f"model.denoiser_noise_frequencies={m.denoiser_noise_frequencies} (a denoiser) "
           "condition the layer norms on different things: set one of them")
  _require(not (m.denoiser_noise_frequencies and d.modalities),
           "model.denoiser_noise_frequencies > 0 (GenCast's denoiser) works on the grid alone, "
           "not with data.modalities")
  problem = LOSSES[t.loss].check(specs)
  _require(problem is None, problem)
  _check_registered_names(config, specs)
  return config


def _check_registered_names(config: ml_collections.ConfigDict, specs: specs_lib.Specs):
  """The names `config` picks from the model's, the data's and the sharding's registries
  (each defined once, with what it names), and the chosen processor's own checks."""
  # Imported here: JAX and xarray, which a mistake found earlier need not wait for.
  from wnscale.data.reading.normalization import INPUT_NORMALIZATIONS  # noqa: PLC0415
  from wnscale.model import remat_policies  # noqa: PLC0415
  from wnscale.model.dtypes_and_activations import DTYPES, OUTPUT_ACTIVATIONS  # noqa: PLC0415
  from wnscale.sharding.exchange import MODES as EXCHANGE_MODES  # noqa: PLC0415
  from wnscale.tracking import registry as tracking_registry  # noqa: PLC0415
  m, d, t = config.model, config.data, config.train
  if m.remat_policy != "auto":
    remat_policies.resolve_policy(m.remat_policy)  # raises naming the unknown policy
  _require(m.dtype in DTYPES, f"model.dtype={m.dtype!r}, expected one of {tuple(DTYPES)}")
  problem = tracking_registry.check(t.trackers)
  _require(problem is None, problem)
  problem = PROCESSORS[m.processor].check(specs)
  _require(problem is None, problem)
  _require(config.mesh.exchange in EXCHANGE_MODES,
           f"mesh.exchange={config.mesh.exchange!r}, expected one of {tuple(EXCHANGE_MODES)}")
  _require(d.input_normalization in INPUT_NORMALIZATIONS,
           f"data.input_normalization={d.input_normalization!r}, expected one of "
           f"{INPUT_NORMALIZATIONS}")
  for name, activation, _ in specs.model.output_activations:
    _require(activation in OUTPUT_ACTIVATIONS, f"model.output_activations: unknown activation "
             f"{activation!r} for {name}, expected one of {tuple(OUTPUT_ACTIVATIONS)}")


def _check_modalities(data: specs_lib.DataSpec):
  """Each `data.modalities` entry: a new node-set name, known surface variables, a weight."""
  names = [modality.name for modality in data.modalities]
  _require(len(set(names)) == len(names), f"data.modalities: names {names} repeat")
  surface = {v.name for v in variables_lib.SURFACE_VARIABLES}
  for modality in data.modalities:
    where = f"data.modalities entry {modality.name!r}"
    _require(modality.name.isidentifier() and modality.name not in ("grid", "mesh"),
             f"{where}: the name must be an identifier other than 'grid' and 'mesh'")
    _require(modality.inputs or modality.targets, f"{where} has neither inputs nor targets")
    _require(modality.source, f"{where}: the source is empty (an observation store's path, "
             "or 'synthetic[:N]')")
    modality.synthetic_stations  # noqa: B018 (raises on a malformed "synthetic:N")
    unknown = sorted(set(modality.inputs + modality.targets) - surface)
    _require(not unknown, f"{where}: {unknown} are not surface variables; known: "
             f"{sorted(surface)}")
    _require(modality.loss_weight >= 0, f"{where}: loss_weight={modality.loss_weight} must "
             "be >= 0")


def _check_recipe(train: specs_lib.TrainSpec):
  """The rollout curriculum, its learning rates and the EMA decay make sense together."""
  schedule = train.rollout_schedule
  firsts = [first for first, _ in schedule]
  _require(not schedule or (firsts[0] == 0 and firsts == sorted(set(firsts))
                            and firsts[-1] < train.steps),
           f"train.rollout_schedule={schedule}: phases start at increasing steps, the first "
           f"at 0, all before train.steps={train.steps}")
  _require(all(steps >= 1 for _, steps in schedule),
           f"train.rollout_schedule={schedule}: every phase's target_steps must be >= 1")
  rates = train.phase_learning_rates
  if rates:
    _require(len(rates) == max(len(schedule), 1),
             f"train.phase_learning_rates has {len(rates)} entries for "
             f"{max(len(schedule), 1)} phase(s) of train.rollout_schedule: give one per phase")
    for (peak, warmup, end), phase in zip(rates, train.phases(target_steps=1)):
      length = phase.end_step - phase.first_step
      _require(peak > 0 and 0 <= end <= peak and 0 <= warmup < length,
               f"train.phase_learning_rates entry {peak}:{warmup}:{end} of the phase at step "
               f"{phase.first_step}: needs peak > 0, 0 <= end <= peak, and a warm-up shorter "
               f"than the phase ({length} steps)")
  _require(0 <= train.ema_decay < 1, f"train.ema_decay={train.ema_decay} must be in [0, 1)")


def _check_keys_and_types(reference, config, prefix):
  for key in config.keys():
    if key not in reference:
      check_key(prefix + key)
  for key, expected in reference.items():
    name = prefix + key
    _require(key in config, f"missing key {name!r}")
    value = config[key]
    if isinstance(expected, ml_collections.ConfigDict):
      _require(isinstance(value, ml_collections.ConfigDict), f"{name} must be a section")
      _check_keys_and_types(expected, value, name + ".")
    elif isinstance(expected, bool):
      _require(isinstance(value, bool), f"{name}={value!r} must be a bool")
    elif isinstance(expected, float):
      _require(isinstance(value, (int, float)) and not isinstance(value, bool),
               f"{name}={value!r} must be a number")
    elif isinstance(expected, (int, str, tuple)):
      _require(isinstance(value, type(expected)) and not isinstance(value, bool),
               f"{name}={value!r} must be of type {type(expected).__name__}")


def to_json(config: ml_collections.ConfigDict) -> dict:
  """`config` as the JSON object that a run's `config.json` holds (`from_json` of its text)."""
  return json.loads(config.to_json_best_effort())


def from_json(text: str) -> ml_collections.ConfigDict:
  """A config saved as JSON (a run's `config.json`), validated.

  JSON lists become the tuples the defaults hold; keys the JSON lacks (a run
  written before they existed) keep their defaults; an unknown key is an error.
  """
  config = default_config()
  _update_from_json(config, json.loads(text), prefix="")
  return validate(config)


def _update_from_json(config, values: dict, prefix: str):
  for key, value in values.items():
    _require(key in config, f"unknown key '{prefix}{key}'")
    if isinstance(config[key], ml_collections.ConfigDict):
      _require(isinstance(value, dict), f"{prefix}{key} must be a section")
      _update_from_json(config[key], value, prefix + key + ".")
    else:
      config[key] = tuple(value) if isinstance(value, list) else value


# The experiment files: `configs/` beside the `wnscale` package, in a checkout (an editable
# install) and in an installed one alike (pyproject.toml installs `configs` beside it).
CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def experiment_names() -> list[str]:
  """The names of the experiment files in `CONFIGS_DIR` (`tiny` for configs/tiny.py)."""
  return sorted(os.path.splitext(os.path.basename(path))[0]
                for path in glob.glob(os.path.join(CONFIGS_DIR, "*.py"))
                if not os.path.basename(path).startswith("_"))


def config_file(config: str) -> str:
  """The config file that `config` names, with its `:argument` (if any) kept.

  `config` is a file (absolute, or from the working directory), or an experiment of
  `configs/` by name from any working directory: `tiny`, `tiny.py` or `configs/tiny.py`
  (`imported:RUN` passes RUN to its `get_config`). A file of that name in the working
  directory comes first.

  Raises:
    ArgumentError: no such file, naming the experiments there are.
  """
  file, colon, argument = config.partition(":")
  if os.path.isfile(file):
    return config
  name = os.path.normpath(file) if file else ""
  name = name[len("configs/"):] if name.startswith("configs/") else name
  if name and os.sep not in name and "/" not in name:
    candidate = os.path.join(CONFIGS_DIR, name if name.endswith(".py") else name + ".py")
    if os.path.isfile(candidate):
      return candidate + colon + argument
  raise ArgumentError("config", file, f"no such config file: give a path (relative paths "
                      f"start at {os.getcwd()}) or the name of an experiment in {CONFIGS_DIR}: "
                      f"{', '.join(experiment_names())} (e.g. `config=tiny`, or "
                      "`config=configs/tiny.py`).")


def load(path: str) -> ml_collections.ConfigDict:
  """Imports the config file `path` names (`config_file`: a path, or an experiment's
  name such as `tiny`), calls its `get_config()` (with the `:argument`, if any) and
  validates it."""
  import importlib.util
  file, colon, argument = config_file(path).partition(":")
  spec = importlib.util.spec_from_file_location("wnscale_config_file", file)
  if spec is None:
    raise UserError(f"Config file {file!r} is not a python file.")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return validate(module.get_config(*([argument] if colon else [])))
