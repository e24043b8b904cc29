"""Receiver blocks: sums and gathers by matrix products equal those by index, values and
gradients, and the layout is what its docstring says."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wnscale.graphs import receiver_blocks
from wnscale.graphs.graph import EdgeSet
from wnscale.model import aggregation, fused_edges
from wnscale.model.processors import GNNSpec


def _sorted_receivers(rng, num_receivers, degrees):
  """Receiver indices, sorted, receiver i appearing `degrees[i]` times."""
  del rng
  return np.repeat(np.arange(num_receivers), degrees).astype(np.int32)


@pytest.mark.parametrize("slots, degrees", [
    (16, "regular"),     # every receiver 3 edges, blocks cut receivers' runs
    (8, "varied"),       # 0..12 edges: empty receivers inside windows, runs over 2 blocks
    (4, "long"),         # a receiver with more edges than a block: its sum spans 4 blocks
])
def test_layout_rows_and_windows(slots, degrees):
  rng = np.random.default_rng(0)
  num_receivers = 40
  degrees = {"regular": np.full(num_receivers, 3), "varied": rng.integers(0, 13, num_receivers),
             "long": np.r_[np.full(10, 2), 13, np.full(29, 1)]}[degrees]
  receivers = _sorted_receivers(rng, num_receivers, degrees)
  blocks = receiver_blocks.block_edges(receivers, num_receivers, slots=slots)
  num_blocks = -(-len(receivers) // slots)
  assert blocks.local.shape == (num_blocks, slots)
  assert blocks.width % 8 == 0
  # Windows start at multiples of ALIGN rows, inside the table as the device pads it.
  assert np.all(blocks.first % receiver_blocks.ALIGN == 0)
  assert np.all(blocks.first + blocks.width
                <= receiver_blocks.table_rows(num_receivers, blocks.width))
  padded = np.full(num_blocks * slots, num_receivers)
  padded[:len(receivers)] = receivers
  local = blocks.local.reshape(-1)
  real = padded < num_receivers
  # Every real edge's receiver is its block's first plus its local index, within the window.
  np.testing.assert_array_equal(
      (np.repeat(blocks.first, slots) + local)[real], padded[real])
  assert np.all(local[real] < blocks.width) and np.all(local[~real] == blocks.width)
  # Each receiver's rows are exactly the (block, window row) pairs of its edges.
  zero_row = num_blocks * blocks.width
  for node in range(num_receivers):
    edges = np.nonzero(padded == node)[0]
    expected = sorted({(e // slots) * blocks.width + local[e] for e in edges})
    got = sorted([r for r in blocks.rows[node:node + 1] if r != zero_row]
                 + list(blocks.extra_rows[blocks.extra_receivers == node]))
    assert got == expected, node
  # The first rows hold every receiver's first block; the extras only the further ones.
  further = sum(max(len({e // slots for e in np.nonzero(padded == node)[0]}) - 1, 0)
                for node in range(num_receivers))
  assert np.count_nonzero(blocks.extra_receivers < num_receivers) == further
  if degrees.max() > 2 * slots:
    assert further >= 3


def _edge_problem(num_receivers=37, seed=0, slots=8, dtype=jnp.float32, width=5):
  rng = np.random.default_rng(seed)
  degrees = rng.integers(0, 9, num_receivers)
  degrees[5] = 3 * slots + 1  # one receiver spanning several blocks
  receivers = _sorted_receivers(rng, num_receivers, degrees)
  senders = rng.integers(0, num_receivers, len(receivers)).astype(np.int32)
  edges = EdgeSet(senders, receivers, np.zeros((len(receivers), 0), np.float32), "n", "n")
  laid_out = receiver_blocks.with_blocks(
      edges, num_receivers, num_receivers,
      receiver_blocks.block_edges(receivers, num_receivers, slots))
  values = jnp.asarray(rng.standard_normal((laid_out.senders.shape[0], width)), dtype)
  table = jnp.asarray(rng.standard_normal((num_receivers, width)), dtype)
  return laid_out, values, table


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_sum_and_gather_by_blocks_equal_by_index(dtype):
  edges, values, table = _edge_problem(dtype=dtype)
  num_receivers = table.shape[0]
  cotangent = jnp.asarray(np.random.default_rng(1).standard_normal(values.shape), dtype)
  tolerance = dict(rtol=1e-6, atol=1e-6) if dtype == jnp.float32 else dict(rtol=1e-2, atol=1e-2)

  def loss(method, values, table):
    receivers = aggregation.receivers_of(edges, method)
    sums = aggregation.sum_to_receivers(values, receivers, num_receivers)
    gathered = aggregation.gather(table, receivers)
    real = edges.receivers < num_receivers  # padding edges: by index any row, by blocks 0
    return (jnp.sum(jnp.sin(sums)) + jnp.sum(jnp.where(real[:, None], gathered, 0)
                                             .astype(jnp.float32) * cotangent)), (sums, gathered)

  # The reference: by index, in float32 (a bfloat16 scatter would add in bfloat16).
  arguments = {"segment_sum": (values.astype(jnp.float32), table.astype(jnp.float32)),
               "matmul": (values, table)}
  results = {method: jax.jit(jax.value_and_grad(lambda v, t, m=method: loss(m, v, t),
                                                argnums=(0, 1), has_aux=True))(*arguments[method])
             for method in ("segment_sum", "matmul")}
  (value_i, (sums_i, gathered_i)), grads_i = results["segment_sum"]
  (value_b, (sums_b, gathered_b)), grads_b = results["matmul"]
  assert sums_b.dtype == jnp.float32 and gathered_b.dtype == dtype
  # bfloat16 values are summed in float32 both ways: the same sums.
  np.testing.assert_allclose(sums_b, sums_i, rtol=1e-6, atol=1e-6)
  real = np.asarray(edges.receivers < num_receivers)
  np.testing.assert_array_equal(np.asarray(gathered_b, np.float32)[real],
                                np.asarray(gathered_i, np.float32)[real])
  np.testing.assert_array_equal(np.asarray(gathered_b, np.float32)[~real], 0)
  np.testing.assert_allclose(value_b, value_i, rtol=1e-5)
  for grad_b, grad_i in zip(grads_b, grads_i):
    assert grad_b.dtype == dtype
    np.testing.assert_allclose(np.asarray(grad_b, np.float32)[:len(grad_i)],
                               np.asarray(grad_i, np.float32), **tolerance)


def test_blocks_under_vmap_equal_by_index():
  edges, values, table = _edge_problem()
  num_receivers = table.shape[0]
  batch = jnp.stack([values, 2 * values])

  def sums(method):
    receivers = aggregation.receivers_of(edges, method)
    return jax.vmap(lambda v: aggregation.sum_to_receivers(v, receivers, num_receivers))(batch)

  np.testing.assert_allclose(sums("matmul"), sums("segment_sum"), rtol=1e-6, atol=1e-6)


def test_auto_is_segment_sum_on_a_cpu_fused_on_a_tpu_and_unknown_methods_fail():
  edges, _, _ = _edge_problem()
  on_cpu = jax.default_backend() == "cpu"
  assert aggregation.resolve("auto") == {"cpu": "segment_sum", "tpu": "fused"}.get(
      jax.default_backend(), "matmul")
  assert aggregation.receivers_of(edges, "auto") is (edges.receivers if on_cpu
                                                     else edges.blocks)
  assert aggregation.receivers_of(edges, "matmul") is edges.blocks
  with pytest.raises(ValueError, match="Unknown aggregation 'scatter'"):
    aggregation.receivers_of(edges, "scatter")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_a_fixed_in_degree_sums_and_gathers_as_by_index(dtype):
  """k edges per receiver, edge j R + r to row r: k table copies and a sum of k slices,
  gradients too."""
  rng = np.random.default_rng(2)
  num_receivers, k, width = 29, 3, 6
  receivers = np.tile(np.arange(num_receivers), k).astype(np.int32)
  edges = EdgeSet(np.zeros_like(receivers), receivers, np.zeros((len(receivers), 0)), "m", "g",
                  in_degree=k)
  values = jnp.asarray(rng.standard_normal((len(receivers), width)), dtype)
  table = jnp.asarray(rng.standard_normal((num_receivers, width)), dtype)
  cotangent = jnp.asarray(rng.standard_normal(values.shape), jnp.float32)

  def loss(by_index, values, table):
    if by_index:  # slot-major indices are not sorted
      sums = jax.ops.segment_sum(values.astype(jnp.float32), receivers, num_receivers)
      gathered = table[receivers]
    else:
      sums = aggregation.sum_to_receivers(values, fixed, num_receivers)
      gathered = aggregation.gather(table, fixed)
    return jnp.sum(jnp.sin(sums)) + jnp.sum(gathered.astype(jnp.float32) * cotangent), sums

  fixed = aggregation.receivers_of(edges, "matmul")
  assert fixed == aggregation.FixedInDegree(k)
  grad = lambda by_index: jax.jit(jax.value_and_grad(
      functools.partial(loss, by_index), argnums=(0, 1), has_aux=True))(values, table)
  (value_f, sums_f), grads_f = grad(False)
  (value_i, sums_i), grads_i = grad(True)
  assert sums_f.dtype == jnp.float32
  np.testing.assert_allclose(sums_f, sums_i, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(value_f, value_i, rtol=1e-6)
  # A bfloat16 table's gradient adds k cotangents in bfloat16, in another order than a scatter.
  tolerance = dict(rtol=1e-6, atol=1e-6) if dtype == jnp.float32 else dict(rtol=1e-2, atol=1e-2)
  for grad_f, grad_i in zip(grads_f, grads_i):
    assert grad_f.dtype == dtype
    np.testing.assert_allclose(np.asarray(grad_f, np.float32), np.asarray(grad_i, np.float32),
                               **tolerance)


# Either way of writing the new edges (over the old ones or not) with each norm; and the
# float32 products (the MLPs' and the 0/1 ones) in one bfloat16 pass, as the kernels make them on
# a TPU at its default precision (here forced on the CPU's interpreter).
@pytest.mark.parametrize("conditioned, write_over_edges, products", [
    (False, True, "float32"), (True, False, "float32"), (True, True, "bfloat16")])
def test_fused_edge_step_equals_messages_and_sum(conditioned, write_over_edges, products,
                                                 monkeypatch):
  """One processor layer's edge work as one kernel per block (Pallas's interpreter on a CPU)
  equals the interaction network's messages and their sum: values, and gradients of the
  edges, both node tables and every parameter (a noise-conditioned norm's too). The
  senders are random: near ones from the windows and far ones both."""
  from flax import nnx
  from wnscale.model.message_passing import InteractionNetwork
  width, conditioning_size = 16, 3
  edges, values, table = _edge_problem(num_receivers=150, width=width, slots=128)
  num_receivers = table.shape[0]
  # Narrow sender windows: some senders near, the others far.
  edges = edges.replace(sender_windows=receiver_blocks.sender_windows(
      edges.senders, edges.blocks, num_receivers, margin=2))
  near = edges.sender_windows.local < edges.sender_windows.width
  far = edges.sender_windows.far_local < edges.sender_windows.far_senders.shape[1]
  assert near.any() and far.any() and not (near & far).any()
  layer = InteractionNetwork(width, conditioning_size=conditioning_size if conditioned else 0,
                             dtype=jnp.float32, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(layer)
  rng = np.random.default_rng(2)
  # Conditioning far from zero, so the conditioned norm's scale and offset matter.
  state = jax.tree.map(lambda x: x + 0.3 * rng.standard_normal(x.shape).astype(x.dtype), state)
  conditioning = jnp.asarray(rng.standard_normal(conditioning_size), jnp.float32)
  senders_table = jnp.asarray(rng.standard_normal(table.shape), jnp.float32)
  real = edges.receivers < num_receivers
  weights = jnp.asarray(rng.standard_normal(values.shape), jnp.float32)

  def loss(fused, state, values, senders_table, table):
    layer = nnx.merge(graphdef, state)
    c = conditioning if conditioned else None
    if fused:
      sums, new_edges = layer.fused_edge_step(values, senders_table, edges.sender_windows,
                                              table, edges.blocks, c, write_over_edges)
    else:
      messages = layer.messages(values, senders_table, table, edges.senders, edges.receivers, c)
      sums = aggregation.sum_to_receivers(messages, edges.receivers, num_receivers)
      new_edges = values + messages
    # Padding edges' new latents differ (their rows are never read): left out.
    return jnp.sum(jnp.tanh(sums)) + jnp.sum(jnp.where(real[:, None], new_edges, 0) * weights)

  arguments = (state, values, senders_table, table)
  reference = jax.value_and_grad(functools.partial(loss, False), argnums=(0, 1, 2, 3))(
      *arguments)
  fused_step = lambda: jax.jit(jax.value_and_grad(functools.partial(loss, True),
                                                  argnums=(0, 1, 2, 3)))(*arguments)
  if products == "float32":
    fused = fused_step()
    np.testing.assert_allclose(fused[0], reference[0], rtol=1e-5)
    tolerance = dict(rtol=2e-4, relative_atol=1e-5)
  else:
    in_float32 = fused_step()
    monkeypatch.setattr(aggregation, "float32_products", lambda platform: products)
    fused = fused_step()
    # Rounded operands: not the float32 kernel's values, but the same function to
    # bfloat16's rounding (8 bits).
    assert not np.array_equal(fused[0], in_float32[0])
    np.testing.assert_allclose(fused[0], reference[0], rtol=1e-2)
    tolerance = dict(rtol=5e-2, relative_atol=1e-2)
  for got, want in zip(jax.tree.leaves(fused[1]), jax.tree.leaves(reference[1]), strict=True):
    np.testing.assert_allclose(got, want, rtol=tolerance["rtol"],
                               atol=tolerance["relative_atol"] * float(np.abs(want).max()))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_senders_by_windows_equal_by_index(dtype):
  """Each edge's sender row by windows (near senders by products, far ones gathered) equals
  the gather by index, and so does its gradient (a scatter by index)."""
  edges, values, table = _edge_problem(dtype=dtype, slots=16)
  rng = np.random.default_rng(3)
  num_senders = 45
  real = np.asarray(edges.receivers) < table.shape[0]
  # Senders near their receivers mostly, some anywhere.
  senders = np.where(rng.random(len(real)) < 0.8,
                     np.clip(np.asarray(edges.receivers) + rng.integers(-6, 6, len(real)), 0,
                             num_senders - 1), rng.integers(0, num_senders, len(real)))
  senders = np.where(real, senders, 0).astype(np.int32)
  windows = receiver_blocks.sender_windows(senders, edges.blocks, num_senders, margin=4)
  assert 0 < np.mean(windows.local[edges.blocks.local < edges.blocks.width] < windows.width) < 1
  assert np.all(windows.first % receiver_blocks.ALIGN == 0)
  assert np.all(windows.first + windows.width <= receiver_blocks.table_rows(num_senders,
                                                                            windows.width))
  sender_table = jnp.asarray(rng.standard_normal((num_senders, table.shape[1])), dtype)
  weights = jnp.asarray(rng.standard_normal(values.shape), jnp.float32)

  def loss(by, table):
    gathered = aggregation.gather_senders(table, windows if by == "windows" else senders)
    return jnp.sum(jnp.where(real[:, None], gathered, 0).astype(jnp.float32) * weights)

  reference = jax.value_and_grad(functools.partial(loss, "index"))(
      sender_table.astype(jnp.float32))
  value, grad = jax.jit(jax.value_and_grad(functools.partial(loss, "windows")))(sender_table)
  np.testing.assert_allclose(value, reference[0], rtol=1e-5 if dtype == jnp.float32 else 2e-2)
  assert grad.dtype == dtype
  # bfloat16: the incoming gradient is rounded to bfloat16 before the sums (by index too).
  np.testing.assert_allclose(np.asarray(grad, np.float32), reference[1],
                             **(dict(rtol=1e-5, atol=1e-5) if dtype == jnp.float32
                                else dict(rtol=1e-2, atol=2e-2)))
  gathered = aggregation.gather_senders(sender_table, windows)
  np.testing.assert_array_equal(np.asarray(gathered, np.float32)[real],
                                np.asarray(sender_table, np.float32)[senders[real]])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_senders_sorted_equal_by_index(dtype):
  """The gather of sender rows by `SortedSenders` is the gather by index, and its gradient
  (each sender's sum, by products on the sender-sorted blocks) the scatter by index: for a
  table longer than the layout's rows, unread rows and senders of many edges (more than a
  block's slots) alike."""
  rng = np.random.default_rng(4)
  num_senders, num_edges, width = 50, 300, 6
  senders = rng.integers(0, 40, num_edges).astype(np.int32)  # rows 40..49 never read
  senders[:40] = 7  # one sender of more than a block's edges
  sorted_senders = receiver_blocks.sorted_senders(senders, 40, slots=16)
  order = sorted_senders.order
  assert np.all(order[num_edges:] == num_edges)  # padding to whole blocks
  assert sorted(order[:num_edges]) == list(range(num_edges))
  assert np.all(np.diff(senders[order[:num_edges]]) >= 0)
  assert len(sorted_senders.blocks.extra_rows) >= 2
  table = jnp.asarray(rng.standard_normal((num_senders, width)), dtype)
  weights = jnp.asarray(rng.standard_normal((num_edges, width)), jnp.float32)

  def loss(by, table):
    gathered = aggregation.gather_senders(table, sorted_senders if by == "sorted" else senders)
    return jnp.sum(gathered.astype(jnp.float32) * weights)

  reference = jax.value_and_grad(functools.partial(loss, "index"))(table.astype(jnp.float32))
  value, grad = jax.jit(jax.value_and_grad(functools.partial(loss, "sorted")))(table)
  assert grad.dtype == dtype and grad.shape == table.shape
  np.testing.assert_allclose(value, reference[0], rtol=1e-5 if dtype == jnp.float32 else 2e-2)
  np.testing.assert_allclose(np.asarray(grad, np.float32), reference[1],
                             **(dict(rtol=1e-5, atol=1e-5) if dtype == jnp.float32
                                else dict(rtol=1e-2, atol=5e-2)))
  assert np.all(np.asarray(grad, np.float32)[40:] == 0)


def test_block_senders_equal_by_index():
  """Each block's `BlockSenders` (its own few rows of the table, its edges sorted over them)
  gathers its edges' sender rows as by index, and their gradient is the scatter by index;
  blocks reading far-apart rows (a gap a 0/1 block over the table's rows would span) and
  of different counts of distinct senders (the rows padded to the most)."""
  rng = np.random.default_rng(5)
  num_senders, per_block, width = 400, 90, 5
  senders = np.concatenate([rng.integers(0, 6, per_block), rng.choice([3, 350, 390], per_block),
                            rng.integers(100, 140, per_block)]).astype(np.int32)
  by_block = receiver_blocks.block_senders(senders, 3, slots=16)
  most = max(len(np.unique(block)) for block in senders.reshape(3, per_block))
  assert by_block.rows.shape == (3, most) and by_block.senders.blocks.width <= 48
  table = jnp.asarray(rng.standard_normal((num_senders, width)), jnp.float32)
  weights = jnp.asarray(rng.standard_normal((per_block, width)), jnp.float32)
  for block in range(3):
    mine = jax.tree.map(lambda x: x[block], by_block)
    indices = senders[block * per_block:(block + 1) * per_block]
    np.testing.assert_array_equal(aggregation.sender_indices(mine), indices)
    loss = lambda table, senders: jnp.sum(aggregation.gather_senders(table, senders) * weights)
    value, grad = jax.jit(jax.value_and_grad(loss))(table, mine)
    want_value, want_grad = jax.value_and_grad(loss)(table, jnp.asarray(indices))
    np.testing.assert_allclose(value, want_value, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)


def test_the_interaction_networks_block_sizes_default_to_the_layouts():
  # The spec's defaults are the ones the chip measured best; the layout's own defaults
  # (used where no spec is given) must not drift from them.
  spec = GNNSpec()
  assert (spec.edge_block_slots, spec.sender_window_margin) == (
      receiver_blocks.BlockSizes().slots, receiver_blocks.BlockSizes().sender_margin)


def test_far_rows_summed_onto_their_senders():
  """The far lists' rows (`SenderWindows`) summed onto their senders in sender order equal
  a sum by index of the rows far edges read; the lists' padding rows add nothing."""
  edges, _, table = _edge_problem(num_receivers=150, width=4, slots=32)
  num_senders = table.shape[0]
  windows = receiver_blocks.sender_windows(edges.senders, edges.blocks, num_senders, margin=1)
  num_blocks, far = windows.far_senders.shape
  read = np.arange(far) < np.bincount(
      np.nonzero(windows.far_local < far)[0], minlength=num_blocks)[:, None]
  assert read.sum() > windows.far_blocks.slots and not read.all()  # several blocks, padding
  rng = np.random.default_rng(5)
  rows = jnp.asarray(rng.standard_normal((num_blocks, far, 4)), jnp.float32)
  by_index = jax.ops.segment_sum(rows[read], windows.far_senders[read], num_senders)
  np.testing.assert_allclose(aggregation.sum_far_rows(rows, windows, num_senders), by_index,
                             rtol=1e-6, atol=1e-6)
