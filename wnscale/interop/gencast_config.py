"""A GenCast checkpoint's configs as a wnscale config.

  GenCast                                         wnscale
  task_config                                     data (GraphCast's mapping,
                                                  `graphcast_config.apply_task`), 12 h steps
  denoiser_architecture_config:
    mesh_size, latent_size,                       model.mesh_levels, latent_size,
    radius_query_fraction_edge_length             radius_fraction
    hidden_layers (1)                             wnscale's MLPs have one
    grid2mesh_aggregate_normalization (None: 1)   model.grid_to_mesh_aggregate_normalization
    norm_conditioning_features                    ("noise_level_encodings",) only
    sparse_transformer_config:                    model.processor = "transformer":
      num_layers, num_heads, ffw_hidden,          transformer_layers, _heads, _ffw_size,
      attention_k_hop                             _k_hop
      d_model                                     must be latent_size
      attention_type, mask_type, block_*          how attention is computed, not what
                                                  (model.transformer_attention)
      ffw_winit_final_mult, attn_winit_final_mult initialisation only
  noise_encoder_config:                           model.denoiser_*:
    num_frequencies, base_period,                 noise_frequencies, noise_base_period,
    output_sizes (hidden, encoding)               noise_hidden_size, noise_encoding_size
    apply_log_first                               True only (log(sigma) is encoded)
  sampler_config:                                 model.sampler_*:
    max_noise_level, min_noise_level,             max_noise_level, min_noise_level,
    num_noise_levels, rho,                        noise_levels, rho,
    stochastic_churn_rate, churn_min_noise_level, churn_rate, churn_min_noise_level,
    churn_max_noise_level,                        churn_max_noise_level (inf: 0, none),
    noise_level_inflation_factor                  noise_level_inflation
  GenCast's edges: features divided by the longest edge of their set (mesh-to-grid too:
  model.mesh_to_grid_edge_normalization 0); the encoder's edge MLP sees the receiver.

The time step (12 h) is not in the checkpoint: it is GenCast's (its task's
`input_duration` of 24 h is two 12 h steps; its precipitation is 12-hourly). Its
`noise_config` (training_noise_level_rho, training_min_noise_level,
training_max_noise_level) is `train.loss='diffusion'`'s keys of those names. A setting
wnscale cannot express is one `UserError` naming it.
"""

from __future__ import annotations

import math

import ml_collections

from wnscale import config as config_lib
from wnscale.errors import UserError
from wnscale.interop import graphcast_config

TIME_STEP_HOURS = 12
# `model.sampler_<key>`: GenCast's `SamplerConfig` field.
SAMPLER = {"max_noise_level": "max_noise_level", "min_noise_level": "min_noise_level",
           "noise_levels": "num_noise_levels", "rho": "rho",
           "churn_rate": "stochastic_churn_rate",
           "churn_min_noise_level": "churn_min_noise_level",
           "churn_max_noise_level": "churn_max_noise_level",
           "noise_level_inflation": "noise_level_inflation_factor"}
ARCHITECTURE = "denoiser_architecture_config"
TRANSFORMER = f"{ARCHITECTURE}:sparse_transformer_config"


def wnscale_config(configs: dict, stats_path: str,
                   nan_fill_values: tuple = ()) -> ml_collections.ConfigDict:
  """The validated wnscale config of a checkpoint's configs.

  Args:
    configs: `gencast_checkpoint.GenCastCheckpoint.configs`.
    stats_path: the run's statistics (a directory of GraphCast's three files).
    nan_fill_values: `data.nan_fill_values` entries ("variable:value"): GenCast's
      `NaNCleaner` fill (sea-surface temperature: its `min_by_level`).

  Raises:
    UserError: a setting wnscale cannot express, named.
  """
  arch = configs["denoiser_architecture_config"]
  transformer = arch["sparse_transformer_config"]
  encoder = configs["noise_encoder_config"]
  expected = {f"{ARCHITECTURE}:hidden_layers": (arch["hidden_layers"], 1,
                                                "wnscale's MLPs have one hidden layer"),
              f"{ARCHITECTURE}:norm_conditioning_features": (
                  tuple(arch.get("norm_conditioning_features", ())),
                  ("noise_level_encodings",),
                  "wnscale conditions the layer norms on the noise-level encoding only"),
              f"{TRANSFORMER}:d_model": (transformer["d_model"], arch["latent_size"],
                                         "wnscale's transformer is latent_size wide"),
              "noise_encoder_config:apply_log_first": (
                  encoder["apply_log_first"], True, "wnscale encodes log(sigma)"),
              "noise_encoder_config:output_sizes": (
                  len(encoder["output_sizes"]), 2,
                  "wnscale's noise-level MLP has one hidden layer (2 sizes)")}
  for key, (value, wanted, why) in expected.items():
    if value != wanted:
      raise UserError(f"{key}={value!r}: wnscale's model has {wanted!r} there ({why}).")
  config = config_lib.default_config()
  m, d = config.model, config.data
  m.latent_size = int(arch["latent_size"])
  m.mesh_levels = int(arch["mesh_size"])
  m.radius_fraction = float(arch["radius_query_fraction_edge_length"])
  m.mesh_to_grid_edge_normalization = 0.0
  m.grid_to_mesh_aggregate_normalization = float(
      arch.get("grid2mesh_aggregate_normalization") or 1.0)
  m.processor = "transformer"
  m.transformer_layers = int(transformer["num_layers"])
  m.transformer_heads = int(transformer["num_heads"])
  m.transformer_ffw_size = int(transformer["ffw_hidden"])
  m.transformer_k_hop = int(transformer["attention_k_hop"])
  m.denoiser_noise_frequencies = int(encoder["num_frequencies"])
  m.denoiser_noise_base_period = float(encoder["base_period"])
  m.denoiser_noise_hidden_size, m.denoiser_noise_encoding_size = (
      int(size) for size in encoder["output_sizes"])
  sampler = dict(configs["sampler_config"])
  highest = float(sampler["churn_max_noise_level"])
  if highest <= 0:
    raise UserError(f"sampler_config:churn_max_noise_level={highest!r}: wnscale's 0 means no "
                    "maximum; a maximum of 0 churns nowhere, as stochastic_churn_rate=0 does.")
  sampler["churn_max_noise_level"] = 0.0 if math.isinf(highest) else highest  # 0: none
  for key, field in SAMPLER.items():
    m[f"sampler_{key}"] = type(m[f"sampler_{key}"])(sampler[field])
  t = config.train
  t.loss = "diffusion"
  t.eval_every = 0  # a denoiser's evaluation is not built yet
  for key, value in configs["noise_config"].items():  # DiffusionSpec's keys are its names
    if key not in t:
      raise UserError(f"noise_config:{key}={value!r}: wnscale's diffusion loss has no such "
                      "setting (train.loss='diffusion').")
    t[key] = float(value)
  d.time_step_hours = TIME_STEP_HOURS
  graphcast_config.apply_task(config, configs["task_config"])
  d.nan_fill_values = tuple(nan_fill_values)
  d.stats_path = stats_path
  return config_lib.validate(config)
