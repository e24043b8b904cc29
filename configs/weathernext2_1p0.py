"""WeatherNext 2's released model `WeatherNextCyclones_Mini.json`, on a 1 deg grid.

  python -m launch.train --config=configs/weathernext2_1p0.py --workdir=DIR \
      --config.data.path=/path/to/era5_13levels.zarr --config.data.stats_path=STATS

Generated from the released fiddle config (weathernext v0.3.0) by the importer's
mapping, `python tools/derive_weathernext2_config.py WeatherNextCyclones_Mini.json --resolution=1
--out=configs/weathernext2_1p0.py`: regenerate, do not edit. Expect: docs/interop.md, "WeatherNext 2's checkpoints".
"""

from wnscale.config import derived_config

DERIVED = {
    'model.dtype': 'float32',
    'model.edge_chunks': 1,
    'model.edge_latent_size': 32,
    'model.grid_blocks': 1,
    'model.grid_to_mesh_aggregate_normalization': 1.0,
    'model.grid_to_mesh_gather_from_receivers': False,
    'model.latent_size': 512,
    'model.mesh_edge_chunks': 1,
    'model.mesh_levels': 5,
    'model.mesh_remat_every': 1,
    'model.mesh_to_grid_edge_normalization': 0.0,
    'model.message_passing_steps': 4,
    'model.noise_channels': 32,
    'model.output_activations': ('cyclone_exists_gaussian_unit_mode:sigmoid:-2.0',),
    'model.processor': 'transformer',
    'model.radius_fraction': 0.6,
    'model.remat_grid_to_mesh_gnn': False,
    'model.remat_mesh_gnn': False,
    'model.remat_mesh_to_grid_gnn': False,
    'model.remat_policy': 'nothing_saveable',
    'model.transformer_attention': 'auto',
    'model.transformer_edges_per_block': 0,
    'model.transformer_ffw_size': 2048,
    'model.transformer_heads': 4,
    'model.transformer_k_hop': 16,
    'model.transformer_layers': 16,
    'data.forcings': ('day_progress_sin', 'day_progress_cos'),
    'data.global_forcings': ('year_progress_sin', 'year_progress_cos'),
    'data.input_normalization': 'all',
    'data.nan_fill_values': ('sea_surface_temperature:269.48291015625',),
    'data.pressure_levels': (50, 100, 150, 200, 250, 300, 400, 500, 600, 700, 850, 925, 1000),
    'data.target_only_variables': ('total_precipitation_6hr', 'cyclone_exists_gaussian_unit_mode', 'cyclone_all_wind_disc', 'cyclone_usa_wind_disc', 'cyclone_usa_r34_ne_radius_disc', 'cyclone_usa_r34_se_radius_disc', 'cyclone_usa_r34_sw_radius_disc', 'cyclone_usa_r34_nw_radius_disc', 'cyclone_usa_r50_ne_radius_disc', 'cyclone_usa_r50_se_radius_disc', 'cyclone_usa_r50_sw_radius_disc', 'cyclone_usa_r50_nw_radius_disc', 'cyclone_usa_r64_ne_radius_disc', 'cyclone_usa_r64_se_radius_disc', 'cyclone_usa_r64_sw_radius_disc', 'cyclone_usa_r64_nw_radius_disc', 'cyclone_usa_rmw_disc', 'cyclone_usa_pres_disc'),
    'data.variables': ('temperature', 'geopotential', 'u_component_of_wind', 'v_component_of_wind', 'vertical_velocity', 'specific_humidity', '2m_temperature', 'mean_sea_level_pressure', '10m_v_component_of_wind', '10m_u_component_of_wind', 'sea_surface_temperature'),
    'train.loss': 'crps',
    'train.ensemble_members': 2,
    'train.remat_rollout': True,
    'train.variable_loss_weights': (),
    'data.resolution': 1.0,
}


def get_config():
  return derived_config(1.0, DERIVED)
