"""The prepared accelerator check (bench/accelerator_check.sh) in its --cpu mode: every step
runs and records its figures, so the script is ready when an accelerator is at hand."""

import json
import os
import subprocess

import pytest

from tiny_runs import REPO, process_env

pytestmark = pytest.mark.slow  # each step in a process of its own


def _check(out, *flags) -> subprocess.CompletedProcess:
  return subprocess.run(["bash", os.path.join(REPO, "bench", "accelerator_check.sh"), str(out),
                         "--cpu", *flags], cwd=REPO, env=process_env(), capture_output=True,
                        text=True, timeout=600)


def _results(out) -> list[dict]:
  with open(os.path.join(out, "results.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_every_step_records_its_figures_on_the_cpu(tmp_path):
  # Each model step as one variant: an aggregation and another key of how it computes.
  # The tests steps run what -k selects of theirs (here their one test each).
  result = _check(tmp_path, "--paper_1deg_remat=auto", "--timed_steps=2",
                  "--aggregations=auto/scan_layers=false", "--tests_k=matmul or sharded")
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert "14 steps ran, 0 failed" in result.stdout
  records = _results(tmp_path)
  assert not [r for r in records if "error" in r], records
  assert all(r["commit"] and r["date"] for r in records)
  by_step = {}
  for record in records:
    by_step.setdefault(record["step"], []).append(record)
  assert list(by_step) == ["devices", "tests", "parity_tests", "setup", "mid_step",
                           "latent256_step", "paper_1deg", "paper_0p25", "forecast",
                           "train_loop", "wn2_mini_step", "gencast_1deg_step", "far_rows",
                           "encoder_blocks"]
  assert by_step["devices"][0]["backend"] == "cpu"
  (setup,) = by_step["setup"]
  parts = [setup[f"{part}_seconds"] for part in ("graphs_and_constants", "partitioned",
                                                 "parameters")]
  assert setup["problem"] == "tiny" and min(parts) >= 0 and parts[2] > 0
  assert sum(parts) == pytest.approx(setup["seconds"], abs=0.05)
  # The far rows' gradient in seven forms: the same sums (bfloat16 to its rounding).
  forms = {r["form"]: r for r in by_step["far_rows"]}
  assert len(forms) == 7 and all(r["far_rows_read"] > 0 and r["milliseconds"] > 0
                                 for r in forms.values())
  assert [r["max_difference"] < 1e-4 for r in forms.values()] == [True] * 6 + [False]
  assert forms["segment sum, bfloat16"]["max_difference"] < 0.5
  # The encoder's edge step by three sizes of blocks of sender rows: the same sums and
  # gradients (bfloat16, summed in other orders).
  encoder = by_step["encoder_blocks"]
  assert [r["block_rows"] for r in encoder] == [512, 256, 128]
  assert all(r["milliseconds"] > 0 and r["kernel_blocks"] > 0 for r in encoder)
  assert encoder[0]["max_relative_difference"] == 0
  assert all(r["max_relative_difference"] < 0.05 for r in encoder)
  for name in ("tests", "parity_tests"):
    assert by_step[name][0]["exit_status"] == 0 and by_step[name][0]["passed"] == 1
  for name in ("mid_step", "latent256_step"):
    side = by_step[name][0]
    ours = side["wnscale"]
    assert ours["step_seconds"] > 0 and ours["compiled_peak_gib"] > 0
    assert ours["aggregation"] == "auto" and ours["scan_layers"] is False
    assert ours["hardware_tflops_per_second"] > 0 and ours["graphcast_tflop"] > 0
    assert ours["device_seconds"] > 0 and sum(ours["op_seconds"].values()) > 0
    # The reference is no dependency of this project: compared where importable.
    assert side["reference"] == "not importable" or side["time_ratio"] > 0
  assert by_step["latent256_step"][0]["problem"]["latent"] == 32
  choice, planned = by_step["paper_1deg"]
  assert choice["choice"] == "none" and "cheapest remat configuration" in choice["reason"]
  assert planned["remat"] == "none" and by_step["paper_0p25"][0]["remat"] == "paper"
  for record in (planned, by_step["paper_0p25"][0]):
    assert record["step_seconds"] > 0 and record["compiled_peak_gib"] > 0
    assert record["hardware_tflops_per_second"] > 0 and record["graphcast_tflop"] > 0
    assert record["op_seconds"]["dot/conv"] > 0
    assert record["aggregation"] == "auto" and record["scan_layers"] is False
  # Recomputation: the paper scheme does more arithmetic than no remat, GraphCast's count not.
  paper = by_step["paper_0p25"][0]
  assert paper["graphcast_tflop"] == pytest.approx(planned["graphcast_tflop"])
  assert paper["hardware_tflop"] > planned["hardware_tflop"]
  forecast = by_step["forecast"][0]
  assert forecast["lead_steps"] == 1 and forecast["steps_per_second"] > 0
  assert "=== forecast" in open(os.path.join(tmp_path, "log.txt")).read()
  loop = by_step["train_loop"][0]
  assert loop["steps_per_second"] > 0 and 0 <= loop["input_wait_fraction"] <= 1
  assert len(loop["intervals"]) == 3  # 40 steps logged every 10, the first left out
  # The same run again (in a new workdir) loads its train step from the compilation cache.
  assert not loop["compiled_from_cache"] and loop["second_start"]["compiled_from_cache"]
  assert loop["second_start"]["compile_seconds"] < loop["compile_seconds"]
  # The CPU's "auto" attention is edges; splash interpreted.
  auto, splash = by_step["wn2_mini_step"]
  assert (auto["transformer_attention"], splash["transformer_attention"]) == ("auto", "splash")
  for record in (auto, splash):
    assert record["fits"] and record["step_seconds"] > 0 and record["compiled_peak_gib"] > 0
    assert record["graphcast_tflop"] is None and record["hardware_tflop"] > 0
  # 162 mesh nodes: 2 x 2 tiles, each with an edge.
  assert auto["tiles_with_an_edge"] is None and splash["tiles_with_an_edge"] == 1.0
  assert auto["loss"] == "mse" and planned["loss"] == "mse"
  # GenCast's: a tiny denoiser's diffusion step with the default remat.
  (gencast,) = by_step["gencast_1deg_step"]
  assert (gencast["loss"], gencast["remat"], gencast["fits"]) == (
      "diffusion", "none", True)
  assert gencast["step_seconds"] > 0 and gencast["compiled_peak_gib"] > 0
  assert gencast["hardware_tflop"] > 0 and gencast["mesh_nodes"] == 162


def test_a_step_out_of_time_is_ended_and_recorded_and_a_wrong_step_is_named(tmp_path):
  result = _check(tmp_path, "--only=devices", "--step_timeout=0.01")
  assert result.returncode == 1
  assert _results(tmp_path) == [{"step": "devices", "error": "not finished in 0 s",
                                 "seconds": pytest.approx(0, abs=5)}]
  wrong = _check(tmp_path, "--only=devices,speed")
  assert wrong.returncode == 1
  assert ("no step 'speed'; the steps are devices, tests, parity_tests, setup, mid_step,"
          in wrong.stderr and wrong.stderr.rstrip().endswith("far_rows, encoder_blocks"))
