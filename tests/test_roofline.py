"""bench/roofline.py on a small problem: every op category in its table, and the achieved
fractions of the machine's limits in (0, 1]."""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import op_profile  # noqa: E402  pylint: disable=g-import-not-at-top
import roofline  # noqa: E402  pylint: disable=g-import-not-at-top

from tiny_runs import process_env  # noqa: E402
from wnscale import config as config_lib  # noqa: E402


def tiny_report() -> dict:
  """`roofline.measure` of the tiny problem with fewer, smaller layers (the same ops,
  compiled and run sooner)."""
  config, points = roofline.problem("tiny")
  config.model.update(latent_size=8, message_passing_steps=2)
  config = config_lib.validate(config)
  return roofline.measure("tiny", config, points, repeats=1, profile_steps=1,
                          matmul_size=256, bandwidth_mib=16)


def test_tiny_roofline_has_every_category_and_fractions_in_range():
  # In a process of its own: jax.profiler's tracer crashed (SIGSEGV in start_trace) in a
  # test process that had loaded libtpu for the TPU-topology compiles.
  measured = subprocess.run(
      [sys.executable, "-c", "import json, test_roofline; "
       "print(json.dumps(test_roofline.tiny_report()))"],
      cwd=os.path.dirname(__file__), env=process_env(), capture_output=True, text=True,
      timeout=300)
  assert measured.returncode == 0, measured.stderr[-3000:]
  report = json.loads(measured.stdout.strip().splitlines()[-1])
  assert 0 < report["flop_fraction"] <= 1, report["flop_fraction"]
  assert 0 < report["bandwidth_fraction"] <= 1, report["bandwidth_fraction"]
  by_category = report["seconds_by_category"]
  assert list(by_category) == list(op_profile.CATEGORIES)
  # The model's ops: matmuls, gathers of senders and receivers, layer norms' reductions.
  # (Under the suite's XLA flags, XLA:CPU makes scatters loops, untraced: none to count.)
  for name in ("dot/conv", "gather", "reduce (layer norm, sums)"):
    assert by_category[name] > 0, (name, by_category)
  ops = report["costliest_ops"]
  assert len(ops) == 10 and [op["seconds"] for op in ops] == sorted(
      (op["seconds"] for op in ops), reverse=True)
  assert all(op["category"] in op_profile.CATEGORIES and "[" in op["shape"] for op in ops)
  text = roofline.table(report)
  for name in op_profile.CATEGORIES:
    assert name in text


HLO = """HloModule jit_step, entry_computation_layout={(f32[8,4]{1,0})->f32[4]{0}}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%gather_dot (p0: f32[8,4], p1: s32[8]) -> f32[8,4] {
  %p0 = f32[8,4]{1,0} parameter(0)
  %p1 = s32[8]{0} parameter(1)
  %g = f32[8,4]{1,0} gather(%p0, %p1), offset_dims={1}, collapsed_slice_dims={0}
  ROOT %d = f32[8,4]{1,0} dot(%g, %p0), lhs_contracting_dims={1}, rhs_contracting_dims={1}
}

%norm (p0.1: f32[8,4]) -> f32[4] {
  %p0.1 = f32[8,4]{1,0} parameter(0)
  %zero = f32[] constant(0)
  ROOT %r = f32[4]{0} reduce(%p0.1, %zero), dimensions={0}, to_apply=%add
}

%moves (p0.2: f32[8,4]) -> f32[4,8] {
  %p0.2 = f32[8,4]{1,0} parameter(0)
  ROOT %t = f32[4,8]{0,1} transpose(%p0.2), dimensions={1,0}
}

%body (t.0: (s32[], f32[8,4])) -> (s32[], f32[8,4]) {
  %t.0 = (s32[], f32[8,4]{1,0}) parameter(0)
  %x = f32[8,4]{1,0} get-tuple-element(%t.0), index=1
  %y = f32[8,4]{1,0} exponential(%x)
  %i = s32[] get-tuple-element(%t.0), index=0
  ROOT %out = (s32[], f32[8,4]{1,0}) tuple(%i, %y)
}

%cond (t.1: (s32[], f32[8,4])) -> pred[] {
  %t.1 = (s32[], f32[8,4]{1,0}) parameter(0)
  ROOT %c = pred[] constant(false)
}

ENTRY %main (x.1: f32[8,4], i.1: s32[8]) -> f32[4] {
  %x.1 = f32[8,4]{1,0} parameter(0)
  %i.1 = s32[8]{0} parameter(1)
  %ynn_fusion = f32[8,4]{1,0} fusion(%x.1, %i.1), kind=kCustom, calls=%gather_dot, metadata={op_name="jit(step)/transpose(jvp(encoder))/dot_general"}
  %copy_fusion = f32[4,8]{0,1} fusion(%ynn_fusion), kind=kLoop, calls=%moves
  %loop = (s32[], f32[8,4]{1,0}) while(%tuple.9), condition=%cond, body=%body
  ROOT %reduce_fusion = f32[4]{0} fusion(%ynn_fusion), kind=kLoop, calls=%norm
}
"""


def test_op_categories_from_hlo_text():
  ops, computations = op_profile.parse_module(HLO)
  categories = {name: op_profile.category(op_profile.opcodes_within(name, ops, computations))
                for name in ("ynn_fusion", "copy_fusion", "loop", "reduce_fusion", "y")}
  # A fusion with a dot is a dot whatever else it holds; a loop is its own time only (its
  # body's ops are timed apart).
  assert categories == {"ynn_fusion": "dot/conv", "copy_fusion": "transpose/copy",
                        "loop": "other", "reduce_fusion": "reduce (layer norm, sums)",
                        "y": "fused elementwise"}
  assert ops["ynn_fusion"].shape == "f32[8,4]" and ops["ynn_fusion"].operands == ["x.1", "i.1"]
  assert ops["loop"].called == ["cond", "body"]
  assert op_profile.model_part(ops["ynn_fusion"].op_name) == "encoder (backward)"
