"""The streaming rollout: the sharded model stepped one lead time at a time.

Initial conditions come from a store (normalized with the training run's
statistics, read straight into the sharded layout's grid order). Each lead
time is one call of the jitted, sharded model step (`ShardedStep`, which the
xarray `predictor.Predictor` steps too), with the history kept on the devices
(donated, so updated in place) and the new state copied to the host while
the next step runs. Device memory therefore holds one step's arrays however
many lead times are forecast. Initial times (with an ensemble, an FGN's or a
denoiser's: pairs of initial time and member) are batched over the mesh's `data`
axis, one per data shard.

On several JAX processes every process runs the same calls in lockstep: each
reads the initial conditions (and computes the forcings and noise) of the batch
rows its devices hold, and every lead time comes back to every host whole.

An FGN's member `k` from initial time `t` draws its noise for lead `l` from
`(run seed, t in hours since 1970, k, l)` (`ensemble.member_noise`): a rerun
gives the same members, and member `k` is the same whatever the ensemble size. A
denoiser's (GenCast's) step runs its sampler, whose noise fields are drawn likewise from
`(run seed, t, k, l)` (`wnscale.model.sampler`).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from wnscale.assembly import Assembly
from wnscale.data import forcings as forcings_lib
from wnscale.data.reading import store as store_lib
from wnscale.data.reading.store import WeatherStore
from wnscale.errors import UserError
from wnscale.inference.nan_fill import NanFill
from wnscale.model import ensemble
from wnscale.model import sampler as sampler_lib
from wnscale.sharding import sharded_model
from wnscale.sharding.layout import BATCH_SPECS
from wnscale.sharding.mesh import DATA
from wnscale.specs import ModelSpec, SamplerSpec, Specs


class ShardedStep:
  """One model step on an assembly's mesh (`sharded_model.forecast_step_fn`), jitted.

  Called with the history `[B, input_steps, C, slots]`, which it donates (the
  step updates it in place), the step's forcings and statics, and `extra` (its
  `globals` and `noise`, where the model takes them), all device arrays laid
  out as `BATCH_SPECS` (`put`), and each input modality's history `<name>/inputs` in
  `extra`; returns `(history, outputs [B, C_out, slots], {<name>/inputs: its history
  moved on}, {target modality: [B, C_t, point slots]})` (`forecast_step_fn`).

  Args:
    assembly: the model on the grid and mesh (`wnscale.assembly.assemble`).
    params: its parameters, replicated on the mesh.
    modalities: the run's `DataSpec.modalities` (their point sets in `assembly`).
    sampler: a denoiser's sampler settings (`ModelSpec.sampler`; None: a forecaster): the
      step samples, `extra` holding `sampler_keys` and `grid_nodes` (`forecast_step_fn`).
  """

  def __init__(self, assembly: Assembly, params, modalities=(), sampler=None):
    self.layout, self.params = assembly.layout, params
    self.constants, self.halo_indices = self.layout.constants(assembly.constants)
    step = sharded_model.forecast_step_fn(self.layout, assembly.graphdef, modalities, sampler)

    def step_fn(params, constants, halo_indices, history, forcings, statics, extra):
      return step(params, constants, halo_indices,
                  {"inputs": history, "forcings": forcings, "statics": statics, **extra})

    self._step = jax.jit(step_fn, donate_argnums=3)
    self._compiled = None

  def put(self, key: str, array: np.ndarray, dtype=np.float32) -> jax.Array:
    """A host batch array (grid axis in slots) of `dtype` on the mesh as `BATCH_SPECS[key]`
    says."""
    return jax.device_put(np.ascontiguousarray(array, dtype),
                          self.layout.sharding(BATCH_SPECS[key]))

  def compile(self, history, forcings, statics, extra):
    """Compiles the step for arrays shaped as these (arrays or `jax.ShapeDtypeStruct`s)."""
    self._compiled = self._step.lower(self.params, self.constants, self.halo_indices, history,
                                      forcings, statics, extra).compile()
    return self._compiled

  @property
  def is_compiled(self) -> bool:
    return self._compiled is not None

  def __call__(self, history, forcings, statics, extra):
    step = self._compiled or self._step
    return step(self.params, self.constants, self.halo_indices, history, forcings, statics,
                extra)


class StreamingForecaster:
  """Forecasts from initial times of `store`, yielding one lead time at a time.

  Args:
    specs: the run's specs (`data`: variables, target-only variables, levels,
      forcings computed or stored, global forcings, steps; the seed and
      `model.noise_channels` of an FGN, or a denoiser's `model.sampler`).
    assembly: the model on the store's grid and the mesh, its normalization
      from the training run's statistics (`wnscale.assembly.assemble`).
    params: the model's parameters, replicated on the mesh.
    store: the initial conditions: the config's state variables and levels, and
      its stored forcings (`data.stored_forcings`) at every time forecast.
    readers: each of `data.modalities`' observations at `store`'s times, in the
      layout's point order (`observations.ModalityReader.in_layout`). A modality's
      inputs at the initial time's history come from its reader; each later step
      takes the model's own predictions of the variables it both reads and predicts,
      and sees the others missing (`sharded_model.fed_back`).
  """

  def __init__(self, specs: Specs, assembly: Assembly, params, store: WeatherStore,
               readers=()):
    d = specs.data
    self.readers = {reader.name: reader for reader in readers}
    self.modalities = tuple(d.modalities)
    self.layout, self.store = assembly.layout, store
    self.input_steps = d.input_steps
    self.time_step = np.timedelta64(d.time_step_hours, "h")
    self.batch_size = self.layout.mesh.shape[DATA]  # initial times per call: one per data shard
    self.forcings, self.stored_forcings = tuple(d.forcings), tuple(d.stored_forcings)
    self.global_forcings = tuple(d.global_forcings)
    self.normalization = norm = assembly.normalization
    self.nan_fill = NanFill(d, norm.mean[:norm.num_state], norm.std[:norm.num_state])
    self.noise_channels = specs.model.noise_channels
    self.noise_key = ensemble.noise_key(specs.seed)
    self.seed = specs.seed
    self.sampler = denoiser_sampler(specs.model)
    self.step = ShardedStep(assembly, params, self.modalities, self.sampler)
    self.rows = self._local_rows()
    statics = self.layout.grid.to_slots(
        norm.input_scales.statics(store.read_statics()), -1)
    self.num_local_rows = self.rows.stop - self.rows.start
    self.statics = self._put("statics", self._each_row(statics))
    # A denoiser's noise is taken at (or per-node noise drawn from) each slot's grid node
    # (`sampler.forecast_noise`).
    self.grid_nodes = (self._put("grid_nodes", self._each_row(self.layout.grid_slots), np.int32)
                       if self.sampler is not None else None)
    # Several processes: outputs made whole on every device, so each host reads them whole.
    self._whole = jax.jit(lambda x: x, out_shardings=NamedSharding(self.layout.mesh, P()))

  def _local_rows(self) -> slice:
    """The batch rows this process's devices hold (all of them in one process)."""
    sharding = self.layout.sharding(BATCH_SPECS["noise"])  # rows only: the batch axis
    blocks = sharding.addressable_devices_indices_map((self.batch_size,)).values()
    return slice(min(block[0].start or 0 for block in blocks),
                 max(block[0].stop or self.batch_size for block in blocks))

  def _put(self, key: str, array: np.ndarray, dtype=np.float32) -> jax.Array:
    """This process's rows `array` of a batch (grid axis in slots, all of it) as the
    global array of `batch_size` rows of `dtype`, laid out as `BATCH_SPECS[key]` says."""
    return self.layout.global_batch({key: array}, self.batch_size, dtype)[key]

  def _each_row(self, array: np.ndarray) -> np.ndarray:
    """`array` repeated for each of this process's rows (a view)."""
    return np.broadcast_to(array, (self.num_local_rows,) + array.shape)

  def _to_whole(self, array: jax.Array) -> jax.Array:
    """`array`, whole on this process's devices (a copy only where it spans processes)."""
    return array if array.is_fully_addressable else self._whole(array)

  def _history(self, init_indices) -> tuple[np.ndarray, np.ndarray]:
    """`(states [B, input_steps, C, slots] normalized up to each initial time, mask
    [B, C, slots] where a `data.nan_fill_values` variable was NaN and is filled)`."""
    offsets = np.arange(1 - self.input_steps, 1)
    norm = self.normalization
    mean, std = norm.mean[:norm.num_state], norm.std[:norm.num_state]
    history = np.stack([self.store.read_state(index + offsets, mean=mean, std=std,
                                              grid_index=self.layout.grid_slots,
                                              allow_nan=self.nan_fill.active)
                        for index in init_indices])
    mask = self.nan_fill.clean(history)
    if self.nan_fill.active and np.isnan(history).any():  # NaN where nothing fills it
      row, step, channel, _ = np.argwhere(np.isnan(history))[0]
      time = self.store.times[init_indices[row] + offsets[step]]
      raise store_lib.NanError(self.store.channel_names[channel], f" at time {time}",
                               self.store.path)
    return history, mask

  def _point_histories(self, init_indices) -> dict:
    """`{<name>/inputs: [B, input_steps, C_m, point slots]}` of each input modality,
    normalized, NaN where missing."""
    offsets = np.arange(1 - self.input_steps, 1)
    return {f"{m.name}/inputs": np.stack([self.readers[m.name].read("inputs", index + offsets)
                                          for index in init_indices])
            for m in self.modalities if m.inputs}

  def _window_times(self, init_times, lead: int) -> list[np.ndarray]:
    """Per initial time, `[input_steps + 1]` times: lead `lead`'s history and target."""
    offsets = np.arange(lead + 1 - self.input_steps, lead + 2) * self.time_step
    return [np.datetime64(t, "ns") + offsets for t in init_times]

  def _forcings(self, init_times, lead: int) -> np.ndarray:
    """`[B, input_steps + 1, F, slots]` normalized, at lead `lead`'s history and target."""
    windows = []
    for times in self._window_times(init_times, lead):
      if self.stored_forcings:  # read from the store: the times must be in it
        indices = np.searchsorted(self.store.times, times)
        if (indices >= len(self.store.times)).any() or (self.store.times[indices] != times).any():
          raise UserError(
              f"The model reads {list(self.stored_forcings)} from the data "
              f"(data.stored_forcings) and {self.store.path} lacks them at some of {times}: "
              "forecast lead times the store covers.")
        values = self.store.forcings_at(indices, self.forcings)
      else:
        values = forcings_lib.compute_forcings(times, self.store.points, self.forcings)
      windows.append(self.normalization.input_scales.forcings(values))
    return self.layout.grid.to_slots(np.stack(windows), -1)

  def _global_forcings(self, init_times, lead: int) -> np.ndarray:
    """`[B, input_steps + 1, F_global]` at lead `lead`'s history and target."""
    return self.normalization.input_scales.globals(np.stack([
        forcings_lib.compute_global_forcings(times, self.global_forcings)
        for times in self._window_times(init_times, lead)]))

  def _extra(self, init_times, members, lead: int) -> dict:
    """The step's `globals` `[B, input_steps + 1, F]`, an FGN's `noise` `[B, K]`, a
    denoiser's `sampler_keys` `[B, 2]` and `grid_nodes`, where needed (device arrays)."""
    extra = {}
    hours = np.array([init_hours(t) for t in init_times], np.int32)
    if self.global_forcings:
      extra["globals"] = self._put("globals", self._global_forcings(init_times, lead))
    if self.noise_channels:
      extra["noise"] = self._put("noise", np.asarray(ensemble.forecast_noise(
          self.noise_key, hours, np.asarray(members, np.int32), lead, self.noise_channels)))
    if self.sampler is not None:
      extra["sampler_keys"] = self._put("sampler_keys", np.asarray(sampler_lib.forecast_keys(
          self.seed, hours, np.asarray(members, np.int32), lead)), np.uint32)
      extra["grid_nodes"] = self.grid_nodes
    return extra

  def compile(self) -> dict:
    """Compiles the step; returns its memory figures (bytes, per device)."""
    slots = len(self.layout.grid_slots)

    def abstract(key, *shape):
      return jax.ShapeDtypeStruct((self.batch_size,) + shape + (slots,), np.float32,
                                  sharding=self.layout.sharding(BATCH_SPECS[key]))

    history = abstract("inputs", self.input_steps, self.normalization.num_state)
    forcings = abstract("forcings", self.input_steps + 1, len(self.forcings))
    extra = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
        self._extra(self.store.times[[0] * self.num_local_rows], [0] * self.num_local_rows, 0))
    extra.update(self.layout.abstract_batch({
        f"{m.name}/inputs": jax.ShapeDtypeStruct(
            (self.batch_size, self.input_steps, len(m.inputs), 0), np.float32)
        for m in self.modalities if m.inputs}))  # abstract_batch: the point axis' slots
    stats = self.step.compile(history, forcings, self.statics, extra).memory_analysis()
    return {"argument_bytes": stats.argument_size_in_bytes,
            "output_bytes": stats.output_size_in_bytes,
            "temp_bytes": stats.temp_size_in_bytes}

  def run(self, init_indices, num_leads: int, members=None):
    """Yields `(lead index, outputs [len(init_indices), C_out, lat * lon], {target
    modality: [len(init_indices), C_t, points]})` per lead time.

    The outputs are the state, then any target-only variables (`data.target_only_variables`);
    a modality's are its targets at its points (the reader's order), in physical units.

    States are float32 in physical units, latitude ascending (the store's
    internal order). `init_indices` index `store.times`, at most `batch_size`
    of them; each needs `input_steps - 1` earlier times in the store.
    `members`: an ensemble's (FGN, denoiser) member of each row (same length). On several
    processes every process calls this with the same arguments.
    """
    if not self.step.is_compiled:
      self.compile()
    count = len(init_indices)
    if not 0 < count <= self.batch_size:
      raise ValueError(f"{count} initial times; a call takes 1..{self.batch_size}")
    indices = list(init_indices) + [init_indices[-1]] * (self.batch_size - count)  # padding
    members = list(members if members is not None else [0] * count)
    members += [members[-1]] * (self.batch_size - count)
    init_times, members = self.store.times[indices][self.rows], members[self.rows]
    history, local_mask = self._history(indices[self.rows])
    history = self._put("inputs", history)
    point_history = {key: self._put(key, value)
                     for key, value in self._point_histories(indices[self.rows]).items()}
    nan_mask = self._whole_mask(local_mask)
    # Every process refills or none: the refill is a computation of them all.
    refill = self.nan_fill.refill(local_mask, self._put, anywhere=nan_mask.any())
    pending = None
    for lead in range(num_leads):
      forcings = self._put("forcings", self._forcings(init_times, lead))
      history, state, point_history, point_state = self.step(
          history, forcings, self.statics,
          {**self._extra(init_times, members, lead), **point_history})
      if refill is not None:  # the fill value again where the inputs were NaN
        history = refill(history)
      state, point_state = self._to_whole(state), jax.tree.map(self._to_whole, point_state)
      for array in [state, *point_state.values()]:
        array.copy_to_host_async()
      if pending is not None:  # the previous lead reaches the host while this one runs
        yield pending[0], *self._to_host(*pending[1:], count, nan_mask)
      pending = (lead, state, point_state)
    yield pending[0], *self._to_host(*pending[1:], count, nan_mask)

  def _whole_mask(self, mask: np.ndarray) -> np.ndarray:
    """`[B, C, slots]`: the NaN masks of all rows from this process's rows `mask`."""
    if jax.process_count() == 1:
      return mask
    if not self.nan_fill.active:  # no row has one
      return np.zeros((self.batch_size,) + mask.shape[1:], bool)
    return np.asarray(self._to_whole(self._put("inputs", mask[:, None])))[:, 0] > 0.5

  def _to_host(self, state: jax.Array, point_state: dict, count: int,
               nan_mask: np.ndarray) -> tuple[np.ndarray, dict]:
    """`([count, C_out, lat * lon], {modality: [count, C_t, points]})` physical units from
    device outputs `[B, C_out, slots]` (NaN where `nan_mask` `[B, C, slots]` is set) and
    `{modality: [B, C_t, point slots]}`."""
    outputs = NanFill.reintroduce(np.asarray(state)[:count], nan_mask[:count])
    normalized = self.layout.grid.from_slots(outputs, -1)
    points = {}
    for name, values in point_state.items():
      stats = self.readers[name].stats["targets"]
      values = self.layout.partitioned.nodes[name].from_slots(np.asarray(values)[:count], -1)
      points[name] = values * stats["std"][:, None] + stats["mean"][:, None]
    return (normalized * self.normalization.std[:, None] + self.normalization.mean[:, None],
            points)


def denoiser_sampler(model: ModelSpec) -> SamplerSpec | None:
  """The sampler a denoiser's (GenCast's) step runs (`ShardedStep`'s `sampler`): the
  model's, or None for a forecaster."""
  return model.sampler if model.denoiser.noise_frequencies else None


def init_hours(time) -> int:
  """An initial time as whole hours since 1970: the noise stream of its members."""
  return int(np.datetime64(time, "h").astype(np.int64))


def live_device_bytes() -> int:
  """Bytes of all live JAX arrays on this process's devices."""
  return sum(shard.data.nbytes for array in jax.live_arrays()
             for shard in array.addressable_shards)

